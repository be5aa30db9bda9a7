"""Delivery analytics: the event log schema, synthetic logs, and the Spark reports.

Importing this package never imports pyspark (STYLE.md: heavy extras are
lazy); the report's modules (:mod:`.jobs` names them) and :mod:`.session`
import it inside the functions that need it. Entry points: ``semq report latency|compact`` (:mod:`.cli`), or
:func:`.jobs.build_report` with a session from :func:`.session.start_session`.
See docs/analytics.md.
"""

from .errors import ReportError
from .events import FIELDS, parse_duration, parse_time, validate_event, validate_file
from .synth import SynthConfig, SynthStats, generate
from .tables import ReportData, Table

__all__ = [
    "FIELDS",
    "ReportData",
    "ReportError",
    "SynthConfig",
    "SynthStats",
    "Table",
    "generate",
    "parse_duration",
    "parse_time",
    "validate_event",
    "validate_file",
]
