"""When an outbox folder's file is whole: the rules (``Readiness``, no I/O,
tested with a fake clock) and what tells them (``FolderEvents``: Linux's
inotify; ``open_for_writing``: who holds a file open, from ``/proc``).

**A file is taken when its writer is done with it.** On Linux the folder is
watched with inotify (through ``inotify_simple``), and a file is *ready*
when

- its writer closed it after writing (``IN_CLOSE_WRITE``), or
- it was renamed into the folder (``IN_MOVED_TO``),

and no process the watcher can see still holds it open for writing
(``/proc/PID/fd``; a writer that pauses, however long, is never cut). A
file the watcher saw being written (``IN_CREATE`` then ``IN_MODIFY``)
waits for that close, with no time limit.

**Files no event spoke of** — there when the watcher started, written from
another machine on a network file system (inotify sees only this machine's
writes), linked in (``ln``), or after the kernel's event queue overflowed
— are taken by the *settle rule*: no process the watcher can see holds it
open for writing, and its size and modification time stayed the same for
``settle`` seconds (watched by this process's clock), or its modification
time is ``settle`` seconds old already (a backlog left while the watcher was
stopped goes at once). Where inotify cannot be had (not Linux, or the
system's inotify limits reached) every file goes by this rule, with the
folder looked at every ``--interval``.

A file is one document, taken once, whole: it is read, checked unchanged
since it was found ready (else it waits again), accepted with its digest,
then moved out of the folder (semq.node.features.folders).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "DEFAULT_SETTLE",
    "Change",
    "FolderEvents",
    "FolderGone",
    "Readiness",
    "Signature",
    "ignored_name",
    "open_events",
    "open_for_writing",
]

DEFAULT_SETTLE: Final = 5.0  # s a file no event spoke of stays unchanged before it is taken
# Names a writer uses while it writes: never taken (nor are dotfiles).
SKIPPED_SUFFIXES: Final = (".tmp", ".part")

#: (size, mtime_ns) of a file as a scan found it.
Signature = tuple[int, int]
#: What an event says of a name: ``closed`` (closed after writing, or
#: renamed in: ready), ``writing`` (written to here: wait for its close),
#: ``created`` (created, no write seen: a link, or a writer not started),
#: ``gone`` (deleted or renamed away).
Change = Literal["closed", "writing", "created", "gone"]


def ignored_name(name: str) -> bool:
    """Names never taken: dotfiles and ``*.tmp`` / ``*.part``."""
    return name.startswith(".") or name.lower().endswith(SKIPPED_SUFFIXES)


@dataclass
class Readiness:
    """Which files of a folder are ready to be taken (module docstring).
    Fed events (``change``) and looks at the folder (``look``); no I/O.
    ``settle`` in seconds; the clocks are handed in by the caller."""

    settle: float = DEFAULT_SETTLE
    _state: dict[str, Change] = field(default_factory=dict)
    _since: dict[str, tuple[Signature, float]] = field(default_factory=dict)  # name -> (signature, first seen)

    def change(self, name: str, what: Change) -> None:
        if ignored_name(name):
            return
        if what == "gone":
            self._state.pop(name, None)
            self._since.pop(name, None)
        elif what == "created" and self._state.get(name) == "writing":
            pass  # (a create after a write: the write's close still decides)
        else:
            self._state[name] = what

    def lost_events(self) -> None:
        """The event queue overflowed: what it said is unknown, so every
        file goes by the settle rule until its next event."""
        self._state.clear()

    def taken(self, name: str) -> None:
        """``name`` was sent or failed (moved away): forget it."""
        self._state.pop(name, None)
        self._since.pop(name, None)

    def look(self, found: Mapping[str, Signature], *, wall: float, mono: float) -> list[str]:
        """The names of ``found`` (the folder now) that are ready, before
        the check for writers that still hold them open. ``wall``: the time
        of day (compared with modification times), ``mono``: a monotonic
        clock (how long a signature has stayed the same)."""
        for name in [n for n in self._since if n not in found]:
            del self._since[name]
        ready: list[str] = []
        for name, sig in found.items():
            state = self._state.get(name)
            if state == "closed":
                ready.append(name)
                continue
            if state == "writing" or (state == "created" and sig[0] == 0):
                # Being written here: only its close decides. (Created and
                # still empty: a writer that has not written yet.)
                self._since.pop(name, None)
                continue
            seen = self._since.get(name)
            if seen is None or seen[0] != sig:
                self._since[name] = seen = (sig, mono)
            if mono - seen[1] >= self.settle or wall - sig[1] / 1e9 >= self.settle:
                ready.append(name)
        return ready


# ---------------------------------------------------------------- inotify

# inotify's bits (linux/inotify.h); inotify_simple.flags has the same values.
_IN_MODIFY: Final = 0x2
_IN_CLOSE_WRITE: Final = 0x8
_IN_MOVED_FROM: Final = 0x40
_IN_MOVED_TO: Final = 0x80
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_Q_OVERFLOW: Final = 0x4000
_IN_IGNORED: Final = 0x8000
_IN_ONLYDIR: Final = 0x01000000
_IN_ISDIR: Final = 0x40000000
_MASK: Final = (_IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
                | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR)


class FolderGone(OSError):
    """The watched folder itself was deleted or moved away."""


class FolderEvents:
    """A folder's inotify events (``open_events`` makes one). ``fileno()``
    is readable when events wait; ``read()`` hands them to a Readiness
    without blocking."""

    def __init__(self, inotify: Any, path: Path) -> None:
        self._inotify = inotify
        self.path = path

    def fileno(self) -> int:
        return int(self._inotify.fileno())

    def read(self, into: Readiness) -> int:
        """Hand the waiting events to ``into``; returns how many say more
        than a file gone (a scan's own moves to sent/ say only that). Raises
        FolderGone when the folder itself went away."""
        events = self._inotify.read(timeout=0)
        news = 0
        for ev in events:
            mask = ev.mask
            if mask & _IN_Q_OVERFLOW:
                into.lost_events()
                news += 1
                continue
            if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED):
                raise FolderGone(f"the folder {self.path} was deleted or moved away")
            if mask & _IN_ISDIR or not ev.name:
                continue
            # In the order they happened: a write after a close makes the
            # file "being written" again; a close after a write makes it ready.
            if mask & (_IN_DELETE | _IN_MOVED_FROM):
                into.change(ev.name, "gone")
                continue
            news += 1
            if mask & (_IN_CLOSE_WRITE | _IN_MOVED_TO):
                into.change(ev.name, "closed")
            elif mask & _IN_MODIFY:
                into.change(ev.name, "writing")
            elif mask & _IN_CREATE:
                into.change(ev.name, "created")
        return news

    def close(self) -> None:
        self._inotify.close()


def open_events(path: Path) -> tuple[FolderEvents | None, str]:
    """inotify on ``path``: (the events, "") or (None, why not) where it
    cannot be had — not Linux, or the system's limits
    (``fs.inotify.max_user_instances`` / ``max_user_watches``) reached."""
    if not sys.platform.startswith("linux"):
        return None, "no inotify on this system"
    try:
        from inotify_simple import INotify
    except ImportError:  # (a dependency: only a broken install lacks it)
        return None, "the inotify_simple package is not installed"
    try:
        ino = INotify()
    except OSError as e:
        return None, f"inotify: {e.strerror or e}"
    try:
        ino.add_watch(path, _MASK)
    except OSError as e:
        ino.close()
        return None, f"inotify on {path}: {e.strerror or e}"
    return FolderEvents(ino, path), ""


# ---------------------------------------------------------------- /proc


def open_for_writing(folder: Path, names: Iterable[str]) -> set[str]:
    """Of ``names`` (files directly in ``folder``), those a process holds
    open for writing, as far as this process can see: ``/proc/PID/fd`` of
    processes of its own user (of every user as root). Empty where there
    is no ``/proc``. Another user's writer is not seen: such writers
    close the file or rename it in, and inotify tells."""
    wanted = set(names)
    if not wanted or not os.path.isdir("/proc/self/fd"):
        return set()
    prefix = os.fsencode(os.path.join(str(folder), ""))
    me = os.getpid()
    held: set[str] = set()
    try:
        pids = [p for p in os.listdir(b"/proc") if p.isdigit() and int(p) != me]
    except OSError:
        return set()
    for pid in pids:
        fd_dir = b"/proc/" + pid + b"/fd/"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir + fd)
            except OSError:
                continue
            if not target.startswith(prefix):
                continue
            name = os.fsdecode(target[len(prefix):])
            if name not in wanted or name in held:
                continue
            if _writable(b"/proc/" + pid + b"/fdinfo/" + fd):
                held.add(name)
    return held


def _writable(fdinfo: bytes) -> bool:
    """Whether the descriptor ``/proc/PID/fdinfo/FD`` describes was opened
    for writing (its ``flags:`` line, octal, O_WRONLY or O_RDWR)."""
    try:
        with open(fdinfo, "rb") as f:
            for line in f:
                if line.startswith(b"flags:"):
                    return bool(int(line.split()[1], 8) & (os.O_WRONLY | os.O_RDWR))
    except (OSError, ValueError, IndexError):
        return False
    return False
