"""The web console's audit log: ``<data dir>/console/audit.jsonl`` (0600).

One JSON object per line for every action attempt, allowed or refused, dry
run or confirmed: ``ts`` (ms), ``user``, ``role``, ``action``, ``args``,
``refused`` (the reason, or null), ``result`` (a summary of the handler's
answer, or the error). Appended with O_APPEND, so the lines of one process
never interleave; the file is never rewritten by the console.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Final

from semq.identity.crypto import ensure_private_directory

from .users import console_dir

__all__ = ["AUDIT_FILE", "AuditLog"]

AUDIT_FILE: Final = "audit.jsonl"
_MAX_READ: Final = 16 * 1024 * 1024  # bytes of the log's tail the Audit page reads


class AuditLog:
    def __init__(self, directory: Path) -> None:
        self.path = console_dir(directory) / AUDIT_FILE

    def append(self, *, user: str, role: str, action: str, args: dict[str, Any], refused: str | None,
               result: Any, ts_ms: int | None = None) -> dict[str, Any]:
        """Append one entry (blocking, small: call it from a thread or accept a
        few microseconds on the event loop). Raises OSError when it cannot be
        written: an action that cannot be audited is not done."""
        entry = {"ts": ts_ms if ts_ms is not None else int(time.time() * 1000), "user": user, "role": role,
                 "action": action, "args": args, "refused": refused, "result": result}
        line = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode("utf-8")
        ensure_private_directory(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line)
        finally:
            os.close(fd)
        return entry

    def tail(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first."""
        try:
            with self.path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - _MAX_READ))
                data = f.read()
        except FileNotFoundError:
            return []
        out: deque[dict[str, Any]] = deque(maxlen=limit)
        for line in data.splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # (the first line of a cut tail)
            if isinstance(e, dict):
                out.append(e)
        return list(reversed(out))
