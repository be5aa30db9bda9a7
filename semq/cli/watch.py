"""``semq watch``: an outbox folder whose files are sent once their writers
are done with them, and an inbox folder each arriving document is written
to (semq.node.features.folders and folder_watch hold the rules; this is
the command around them).

One synchronous loop that sleeps in one ``select``: it wakes when the
outbox folder has events (inotify), when the node's daemon says a document
arrived (``wait_inbox`` on its admin socket), on SIGTERM / SIGINT (a
wake-up pipe), and every ``--interval`` for a look at the outbox folder
(files no event speaks of: network file systems, the settle time). The
inbox is read only when the daemon says so; while no daemon answers, it
is read every ``--interval`` (said once). The signals set a flag the loop
reads between batches, so a batch in progress is finished (its files
moved) before the command exits 0. A store error (locked for longer than
the busy timeout, disk full) is said on stderr and tried again after
``--interval``, as is a file system error (a folder gone, full or not
writable): a folder service outlives a transient failure.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Final

from semq.cli._common import UsageError, check_address, check_colleague, config_of
from semq.store.db import StoreError

__all__ = ["LOCK_NAME", "register"]

LOCK_NAME: Final = ".semq-watch.lock"  # in each watched folder: one watcher per folder
MAX_SETTLE: Final = 24 * 3600.0  # s: --settle at most a day
# s between two looks at the outbox folder at most: a writer of thousands
# of files wakes the loop at each close; looks spaced so let each take a
# larger batch (one commit, one fsync) and leave the writer its CPU.
SCAN_GAP: Final = 0.1

EPILOG: Final = """\
examples:
  semq watch --dir A --outbox /srv/erp/out --to 56001 --type INVOICE --key-from-name
  semq watch --dir B --inbox /srv/erp/in
  semq watch --dir A --outbox out --to 56001 --type ORDER --inbox in --settle 30

A file is taken when its writer closed it after writing, or when it is
renamed into the outbox (on Linux, told by inotify), however long the writer
pauses in between; a file no event speaks of (there at start, written from
another machine over a network file system, or without inotify) once its
size and time stayed the same for --settle seconds. Safest for any writer:
write it elsewhere on the same file system (or as NAME.tmp / NAME.part, or a
dotfile) and rename it in. It moves to sent/ once accepted, or to failed/
with NAME.reason.txt."""


class _Stop:
    """SIGTERM / SIGINT seen (set by the handlers, read by the loop)."""

    def __init__(self) -> None:
        self.signal = 0

    def __call__(self) -> bool:
        return bool(self.signal)

    def handle(self, signum: int, _frame: Any) -> None:
        self.signal = signum


def _lock(folder: Path) -> int:
    """An exclusive lock on ``folder`` (held until the process ends): two
    watchers on one folder would send its files twice."""
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"{folder} is watched by another process already ({folder / LOCK_NAME} is locked)") from None
    return fd


def _folder(path: str, flag: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{flag} {path}: no such directory")
    return p.resolve()


def cmd_watch(args: argparse.Namespace) -> int:
    from semq.node.api import NodeClient
    from semq.node.features.folders import FolderOptions, InboxFolder, OutboxFolder

    if not args.outbox and not args.inbox:
        raise UsageError("nothing to watch: give --outbox DIR (with --to) and/or --inbox DIR")
    if args.outbox and not args.to:
        raise UsageError("--outbox needs --to ORG: the organization its files are sent to")
    if args.key and args.key_from_name:
        raise UsageError("--key and --key-from-name: give one (the key of every file, or each file's name)")
    if not args.interval > 0:
        raise UsageError(f"--interval {args.interval:g} is not a positive number of seconds")
    if not 0 <= args.settle <= MAX_SETTLE:
        raise UsageError(f"--settle {args.settle:g} is outside 0..{MAX_SETTLE:g} seconds")
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch} is not a positive number of files")
    cfg = config_of(args, "node")
    outbox = _folder(args.outbox, "--outbox") if args.outbox else None
    inbox = _folder(args.inbox, "--inbox") if args.inbox else None
    if outbox is not None and outbox == inbox:
        raise UsageError(f"--outbox and --inbox are the same directory {outbox}: received files would be sent")
    options = None
    if outbox is not None:
        check_address(args.to, cfg.org)
        options = FolderOptions(to=args.to, data_type=args.type, domain=args.domain, subtype=args.subtype,
                                key=args.key, key_from_name=args.key_from_name, save_fwd=args.save_fwd,
                                ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                                ordered=args.ordered)
        options.document("x", b"")  # the options' AppKey and priority, checked before anything is taken
        if not 0 <= args.priority <= 9:
            raise UsageError(f"--priority {args.priority} is outside 0..9")
    locks = [_lock(f) for f in (outbox, inbox) if f is not None]
    stop = _Stop()
    before = {s: signal.signal(s, stop.handle) for s in (signal.SIGTERM, signal.SIGINT)}
    # A signal also writes a byte here: the loop's select wakes at once.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        wakeup_before: int | None = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    except ValueError:  # (not the main thread: the flag is read at each wake instead)
        wakeup_before = None
    out = None
    try:
        with NodeClient(cfg.directory, config=cfg) as node:
            if options is not None:
                check_colleague(node, args.to)
            if outbox is not None and options is not None:
                out = OutboxFolder(node, outbox, options, batch=args.batch, settle=args.settle)
            into = InboxFolder(node, inbox, ext=args.inbox_ext) if inbox is not None else None
            what = [f"outbox {outbox} -> {args.to}"] if out else []
            what += [f"inbox {inbox}"] if into else []
            print(f"watching {' and '.join(what)} ({_how(out, args)})", file=sys.stderr, flush=True)
            _loop(out, into, args.interval, stop, wake_r)
    finally:
        if out is not None:
            out.close()
        if wakeup_before is not None:
            signal.set_wakeup_fd(wakeup_before)
        os.close(wake_r)
        os.close(wake_w)
        for s, handler in before.items():
            if handler is not None:  # (None: set outside Python; nothing to put back)
                signal.signal(s, handler)
        for fd in locks:
            os.close(fd)
    print(f"stopped ({signal.Signals(stop.signal).name})" if stop.signal else "stopped", file=sys.stderr, flush=True)
    return 0


def _how(out: Any, args: argparse.Namespace) -> str:
    """How the outbox's files are told whole, for the ``watching`` line."""
    parts = []
    if out is not None:
        if out.events is not None:
            parts.append(f"a file when its writer closes it or renames it in; one no event speaks of"
                         f" after {args.settle:g} s unchanged, looked for every {args.interval:g} s")
        else:
            parts.append(f"{out.events_off}: a file after {args.settle:g} s unchanged,"
                         f" looked for every {args.interval:g} s")
    if args.inbox:
        parts.append("the inbox when the node says a document arrived")
    return "; ".join(parts)


def _say(outcome: Any) -> None:
    print(outcome.line(), flush=True)


def _loop(out: Any, into: Any, interval: float, stop: _Stop, wake: int) -> None:
    """Scan, drain, then sleep in one select until something happens
    (module docstring)."""
    from semq.session.inbox_wait import MAX_WAIT, DaemonAway, WaitRefused

    inbox_due = into is not None  # read it once at start, then when the daemon says
    later = False  # the inbox's wait failed (no daemon): asked again after an interval
    said = False  # ... and said so, once
    last = -SCAN_GAP
    while not stop():
        if (gap := last + SCAN_GAP - time.monotonic()) > 0:
            select.select([wake], [], [], gap)
            if stop():
                break
        start = last = time.monotonic()
        failed = False
        try:
            if out is not None:
                out.scan(stop, report=_say)
            if into is not None and inbox_due:
                inbox_due = False
                into.drain(stop=stop, report=_say)
        except (StoreError, OSError) as e:  # (a folder gone or not writable: said, then tried again)
            print(f"error: {e} (trying again in {interval:g} s)", file=sys.stderr, flush=True)
            failed = True
            inbox_due = into is not None
        if stop():
            break
        news = False
        try:
            news = out is not None and out.absorb()  # events came during the scan: look again at once
        except OSError as e:
            print(f"error: {e} (trying again in {interval:g} s)", file=sys.stderr, flush=True)
            failed = True
        fds = [wake] + ([out.fileno()] if out is not None and out.fileno() is not None else [])
        # The outbox is looked at every interval; the inbox only waits for its wake.
        timed = out is not None or failed or later
        span = max(0.0, interval - (time.monotonic() - start)) if timed else MAX_WAIT
        if news:
            span = 0.0
        if into is not None and not failed and not later:
            if said:
                span = 0.0  # the node's first answer since it was away: at once, to say so
            try:
                inbox_due = into.wait(span, also=fds)
            except (DaemonAway, WaitRefused) as e:
                if not said:
                    print(f"{e}: reading the inbox every {interval:g} s until the node answers",
                          file=sys.stderr, flush=True)
                    said = True
                later = inbox_due = True
                continue
            if said:
                print("the node answers again: the inbox is read when it says a document arrived",
                      file=sys.stderr, flush=True)
                said = False
        else:
            select.select(fds, [], [], span)
            if later:
                later, inbox_due = False, into is not None
        _drain_pipe(wake)


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def register(sub: Any) -> None:
    """Add ``semq watch`` to semq's subparsers (``build_parser`` calls this)."""
    from semq.node.features.folder_watch import DEFAULT_SETTLE
    from semq.node.features.folders import WATCH_BATCH

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    x = sub.add_parser(
        "watch", parents=[common], help="send the files dropped in a folder; write arriving documents to one",
        description=textwrap.fill(
            "Send every complete file dropped in an outbox folder (then move it to sent/, or to failed/ with its"
            " reason) and write every document that arrives into an inbox folder, until SIGTERM or SIGINT. No file"
            " is sent twice or lost across restarts: each file's name and SHA-256 are recorded in the node's store"
            " with its document.", 79),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("--outbox", metavar="DIR", help="the folder whose complete files are sent (sent/ and failed/"
                                                   " are made inside it)")
    x.add_argument("--to", metavar="ORG", help="the target of the outbox's files: an organization (56001), a user"
                                               " of one (56001/alice), or a user of this node")
    x.add_argument("--type", default="", help="AppKey data type of the outbox's files, e.g. INVOICE")
    x.add_argument("--domain", default="", help="AppKey domain, e.g. trade")
    x.add_argument("--subtype", default="", help="AppKey subtype, e.g. PO")
    x.add_argument("--key", default="", help="AppKey key of every file (see --key-from-name)")
    x.add_argument("--key-from-name", action="store_true",
                   help="the AppKey key of each file is its name without the extension (INV-0042.xml:"
                        " INV-0042); a name over the AppKey limit goes to failed/")
    x.add_argument("--save-fwd", type=int, default=3, choices=[1, 2, 3],
                   help="when the target is offline: 1 drop, 2 store at the platform, 3 must be delivered"
                        " (default 3)")
    x.add_argument("--ack2", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the receiver for an end-to-end confirmation (default on)")
    x.add_argument("--priority", type=int, default=0, help="0..9, higher goes first (default 0)")
    x.add_argument("--expires-in", type=float, metavar="SECONDS", help="not delivered after that")
    x.add_argument("--ordered", metavar="CHANNEL",
                   help="the files reach the target's application in the order they were taken (time, then"
                        " name) on this ordered channel")
    x.add_argument("--inbox", metavar="DIR", help="write each document that arrives for the organization here"
                                                  " (KEY__LK0.bin, atomically), then acknowledge it")
    x.add_argument("--inbox-ext", default="bin", metavar="EXT",
                   help="extension of the inbox's files (default bin)")
    x.add_argument("--settle", type=float, default=DEFAULT_SETTLE, metavar="SECONDS",
                   help="a file no event speaks of (there at start, written over a network file system, or on a"
                        f" system without inotify) is taken once unchanged this long (default {DEFAULT_SETTLE:g})")
    x.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between looks at the outbox folder for files no event speaks of (default 1)")
    x.add_argument("--batch", type=int, default=WATCH_BATCH, metavar="N",
                   help=f"files accepted per store transaction (default {WATCH_BATCH})")
    x.set_defaults(func=cmd_watch)
