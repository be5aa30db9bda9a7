"""``python -m semq.ops``: the operational commands alone."""

import sys

from semq.ops.cli import main

sys.exit(main())
