"""Small Spark helpers the report and compaction jobs share.

Type objects by name instead of DDL text, literal columns and small literal
tables, casting a DataFrame to a column layout, deleting a path through
Hadoop's file systems, the time units of the buckets, and the stopwatch that
reports each stage's seconds (docs/analytics.md "Performance" says why each
of these is done the way it is). pyspark is imported inside the functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

__all__ = ["DAY_MS", "HOUR_MS"]

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000


class _Stopwatch:
    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.start = self.last = time.monotonic()
        self.stages: dict[str, float] = {}

    def lap(self, stage: str, detail: str = "") -> None:
        now = time.monotonic()
        self.stages[stage] = round(now - self.last, 2)
        self.last = now
        self.progress(f"{stage}: {detail + ', ' if detail else ''}{self.stages[stage]:.1f} s")


def _t(name: str) -> Any:
    """The Spark type of a type name, as an object.

    Casts and schemas are given to Spark as type objects (sent as JSON), not
    as names or DDL text, which Spark parses with its SQL grammar (ANTLR):
    in a fresh JVM that parser's warm-up and JIT compilation measured about
    1.6 s of CPU per report.
    """
    from pyspark.sql import types as T

    kinds = {"string": T.StringType, "bigint": T.LongType, "long": T.LongType,
             "int": T.IntegerType, "tinyint": T.ByteType, "boolean": T.BooleanType,
             "double": T.DoubleType, "date": T.DateType}
    return kinds[name]()


def _struct(columns: list[tuple[str, str]]) -> Any:
    """A StructType of (name, type name) (see :func:`_t`)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(n, _t(t), True) for n, t in columns])


def _dates(days: list[str]) -> list[Any]:
    """`date` partition values as literals (no cast of every partition value)."""
    from datetime import date

    from pyspark.sql import functions as F

    return [F.lit(date.fromisoformat(d)) for d in days]


def _utc_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date().isoformat()


def _typed(df: Any, columns: list[tuple[str, str]]) -> Any:
    from pyspark.sql import functions as F

    return df.select(*[F.col(n).cast(_t(t)).alias(n) for n, t in columns])


def _literal_table(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> Any:
    """A small DataFrame of Python rows, shipped as one JSON literal.

    ``spark.createDataFrame`` pickles the rows and unpickles them in tasks; in
    a fresh JVM that first use cost more than a second. `schema`: ``"name
    type, ..."`` (type names of :func:`_t`).
    """
    import json

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    columns = [(f.split()[0], f.split()[1]) for f in schema.split(",")]
    text = json.dumps([dict(zip([n for n, _ in columns], r, strict=True)) for r in rows])
    return (
        spark.range(1)
        .select(F.explode(F.from_json(F.lit(text), T.ArrayType(_struct(columns)))).alias("r"))
        .select("r.*")
    )


def _delete(spark: Any, path: str) -> None:
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(p):
        fs.delete(p, True)
