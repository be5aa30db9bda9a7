from semq.cli import main

raise SystemExit(main())
