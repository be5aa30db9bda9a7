"""What a benchmark reads about a process it started (Linux /proc)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds"]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process so far, s (/proc/PID/stat);
    None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command (which may hold spaces) start after its ")".
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
