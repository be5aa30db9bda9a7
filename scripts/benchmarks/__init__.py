"""SEMQ benchmarks, run through ``scripts/bench NAME [args...]``.

Each public module here (a name not starting with ``_``) is one benchmark and
defines ``main(argv: list[str]) -> int``; ``scripts/bench.py`` finds them by
listing this directory, so adding a benchmark is adding a file. The module
docstring's first line is what ``scripts/bench --list`` shows. Benchmarks are
not timed tests: they print figures for a person to read and record in
docs/benchmarks.md, and never fail because the machine is slow.
"""
