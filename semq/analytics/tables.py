"""Report results as plain Python tables, ready to render and to write out.

The Spark jobs collect every result table to the driver (they are small:
aggregates, the stuck list), so rendering HTML/text and writing CSV/Parquet
need no Spark and are tested without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReportData", "Table"]

COLUMN_TYPES = ("string", "long", "double", "bool")


@dataclass(kw_only=True)
class Table:
    """One named result table: column names, their types, and rows (tuples)."""

    name: str
    title: str
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.types):
            raise ValueError(f"table {self.name}: {len(self.columns)} columns, {len(self.types)} types")
        bad = [t for t in self.types if t not in COLUMN_TYPES]
        if bad:
            raise ValueError(f"table {self.name}: unknown column types {bad}")

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(kw_only=True)
class ReportData:
    """Everything a report shows: facts about the run, and the tables by name."""

    meta: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)

    def add(self, table: Table) -> None:
        self.tables[table.name] = table

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]
