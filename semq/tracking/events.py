"""The delivery event log (docs/events.md): JSON lines, one file per UTC day.

Records are appended after the state change they describe is committed, so
the log never claims more than the store holds."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import IO, Any

import orjson

_log = logging.getLogger("semq.tracking.events")

__all__ = ["EventLog", "now_ms"]


def now_ms() -> int:
    return int(time.time() * 1000)


class EventLog:
    def __init__(self, directory: Path, logger: str, role_default: str, *, unit: int = 1) -> None:
        self.directory = Path(directory)
        # Each unit of a node (semq.umxt_protocol.units) appends to its own file.
        self._suffix = "" if unit == 1 else f"-unit{unit}"
        self.logger = logger
        self.role = role_default
        self._day = ""
        self._file: IO[bytes] | None = None
        self._tail = b',"v":1,"logger":' + orjson.dumps(logger) + b"}\n"
        # ... with the default role, for records that do not name one.
        self._role_tail = b',"role":' + orjson.dumps(role_default) + self._tail
        self.dropped = 0

    def _open(self, ts: int) -> IO[bytes]:
        day = time.strftime("%Y-%m-%d", time.gmtime(ts / 1000))
        if day != self._day or self._file is None:
            if self._file is not None:
                self._file.close()
            if not self.directory.is_dir():
                self.directory.mkdir(parents=True, mode=0o700)
            # Owner-only (0600, like the store): the log says who exchanged
            # what with whom. The daemons refuse logs others can read
            # (semq.settings.config.check_private_paths).
            fd = os.open(self.directory / f"events-{day}{self._suffix}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "ab")
            self._day = day
        return self._file

    def write(self, records: list[dict[str, Any]]) -> None:
        """Append records (each needs ``ts`` and ``event``; ``role`` defaults).
        Never raises: the log is written after the store committed, so a full
        disk here must not turn an accepted document into a reported failure
        (the store is the truth; the lost lines are counted in ``dropped``)."""
        if not records:
            return
        try:
            self._write(records)
        except OSError as e:
            self.dropped += len(records)
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
            _log.warning("event log %s: %d record(s) not written: %s", self.directory, len(records), e)

    def _write(self, records: list[dict[str, Any]]) -> None:
        f = self._open(records[0]["ts"])
        # The constant tail (format version, logger; the role when the record
        # has none) is spliced onto each serialized record instead of being
        # added to its dict: adding keys to a full dict resizes it (or copies
        # it), more than the serialization itself costs.
        tail, role_tail, dumps = self._tail, self._role_tail, orjson.dumps
        f.write(b"".join([
            dumps(r)[:-1] + (tail if "role" in r else role_tail) for r in records
        ]))
        f.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
