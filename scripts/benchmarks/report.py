"""`scripts/bench report`: the Spark report benchmark
(the same run as `scripts/bench analytics`)."""

from __future__ import annotations

if __package__:
    from .analytics import main as _analytics_main
else:  # run as a file: python scripts/benchmarks/report.py
    from analytics import main as _analytics_main  # type: ignore[no-redef]


def main(argv: list[str]) -> int:
    return _analytics_main(argv)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
