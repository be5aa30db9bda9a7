"""What a benchmark reads about a process it started (Linux /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

__all__ = ["alive", "cpu_seconds", "parent_pid", "terminate"]


def _fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command (which may hold
    spaces: they start after its ")"), state first; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process so far, s (/proc/PID/stat);
    None once it is gone."""
    fields = _fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parent_pid(pid: int) -> int | None:
    """The parent's PID of a live process; None once it is gone."""
    fields = _fields(pid)
    return None if fields is None else int(fields[1])


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead."""
    fields = _fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def terminate(p: subprocess.Popen[bytes], grace: float) -> None:
    """Stop a process the benchmark started: SIGTERM, then SIGKILL if it is
    still there after ``grace`` s (and wait for it, at most 10 s more)."""
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)
