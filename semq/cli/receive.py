"""``semq receive --exec CMD``: run a command for each document that
arrives, like ``nats sub`` / ``mosquitto_sub`` piped into a handler, with
acknowledgement, retries and parking.

Contract (docs/cli.md, "semq receive"):

- one run of ``sh -c CMD`` per document: the document on its stdin, its
  metadata in the environment (``SEMQ_ID``, ``SEMQ_LK0``, ``SEMQ_FROM``,
  ...). Values come from another organization: they are data, passed in
  the environment and never put into the command's text, so no shell ever
  interprets them.
- exit status 0: the document is acknowledged (with its tries forgotten,
  one commit). Anything else (or killed after ``--timeout``): tried again
  after ``--backoff`` seconds, doubling each time (at most
  ``MAX_BACKOFF``); after ``--max-tries`` failed runs it is *parked*: left
  unacknowledged, recorded with its tries, last exit status and the end of
  its stderr (semq.node.features.receiving), listed by ``--parked`` and given back
  by ``--retry ID``.
- at least once: a document is acknowledged only after its command
  exited 0. If ``semq receive`` dies while a command runs (SIGKILL, power)
  the document is run again at the next start; a command must tolerate
  that (an order number already booked is booked once).
- order: documents are taken in id order, one command at a time; a
  document waiting for its next try does not hold the others back, except
  the later documents of its ordered channel (same origin and channel),
  which wait for it — also while it is parked.
- no polling: between documents it waits for the node daemon's wake
  (NodeClient.wait) or for the next try that is due.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Final

from semq.cli._common import UsageError, app_key_shown, client_of, format_time
from semq.cli.inbox import doc_id
from semq.ops.display import shown

__all__ = ["MAX_BACKOFF", "register"]

log = logging.getLogger("semq.receive")

MAX_BACKOFF: Final = 600.0  # s: the longest wait between two tries of one document
_STDIN_ERRORS: Final = (BrokenPipeError, ConnectionResetError)


@dataclass
class _Outcome:
    code: int | None  # exit status; negative: killed by that signal
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out


def _env_value(text: str) -> str:
    # An environment cannot hold NUL; everything else is passed as it came.
    return text.replace("\x00", "\\x00")


def document_env(item: Any) -> dict[str, str]:
    """The environment variables that describe ``item`` (an InboxItem)."""
    ak = item.app_key
    return {k: _env_value(v) for k, v in {
        "SEMQ_ID": str(item.id), "SEMQ_LK0": str(item.lk0), "SEMQ_FROM": item.lk0.endpoint.node_id,
        "SEMQ_FROM_USER": item.from_user, "SEMQ_TO_USER": item.to_user, "SEMQ_CHANNEL": item.channel,
        "SEMQ_DOMAIN": ak.domain, "SEMQ_TYPE": ak.data_type, "SEMQ_SUBTYPE": ak.subtype, "SEMQ_KEY": ak.key,
        "SEMQ_SIZE": str(item.size), "SEMQ_RECEIVED": str(item.received_ms),
    }.items()}


def run_command(command: str, item: Any, timeout: float | None) -> _Outcome:
    """One run of ``sh -c command`` for ``item``: stdout passes through,
    stderr is copied to ours and its end kept. Its own process group, so
    a timeout kills what it started too."""
    env = {**os.environ, **document_env(item)}
    # A large document is the command's stdin as its file, never read here.
    source = None if item.path is None else open(item.path, "rb")
    try:
        proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE if source is None else source,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    finally:
        if source is not None:
            source.close()  # (the child holds its own descriptor)
    timed_out = False
    try:
        try:
            _, err = proc.communicate(item.app_data if item.path is None else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            _, err = proc.communicate()
    except BaseException:  # interrupted: the document stays unacknowledged, the command goes
        _kill(proc)
        proc.wait()
        raise
    text = err.decode("utf-8", "replace")
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
    if timed_out:
        text += f"\n[killed after {timeout:g} s (--timeout)]"
    return _Outcome(code=proc.returncode, stderr=text, timed_out=timed_out)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _channel(item: Any) -> tuple[str, str] | None:
    return (item.lk0.endpoint.node_id, item.channel) if item.channel else None


def _describe(code: int | None, timed_out: bool) -> str:
    if timed_out:
        return "timed out"
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class Receiver:
    """The loop of ``semq receive --exec``."""

    def __init__(self, node: Any, args: argparse.Namespace) -> None:
        self.node = node
        self.command: str = args.exec
        self.max_tries: int = args.max_tries
        self.backoff: float = args.backoff
        self.timeout: float | None = args.timeout
        self.user: str | None = args.user
        self.once: bool = args.once
        self.pending: dict[int, Any] = {}  # inbox id -> InboxItem, in the order taken
        self.held: set[tuple[str, str]] = set()  # channels a parked document holds back
        self.done = 0

    def _load(self, *, clean: bool = False) -> None:
        """Tries and parked documents from the store (they survive a restart)."""
        from semq.node.features.receiving import tries

        self.tries = tries(self.node, clean=clean)
        self.held = set()
        for nid, t in self.tries.items():
            if t.parked_ms is not None:
                try:
                    ch = _channel(self.node.get(nid))
                except KeyError:
                    continue
                if ch:
                    self.held.add(ch)

    def _refresh(self) -> None:
        """After a wake: documents un-parked meanwhile (``--retry``) come back."""
        before = self.tries
        self._load()
        for nid, t in self.tries.items():
            was = before.get(nid)
            if t.parked_ms is None and nid not in self.pending and (was is None or was.parked_ms is not None):
                try:
                    item = self.node.get(nid, user=self.user)
                except KeyError:
                    continue
                if item.consumed_ms is None:
                    self.pending[nid] = item

    def _next(self) -> tuple[Any | None, float | None]:
        """The next document to run now, or the seconds until one is due."""
        now = time.time() * 1000
        blocked = set(self.held)
        due_in = None
        # In id order: a document given back by --retry goes before the
        # later ones of its channel that waited for it.
        for nid, item in sorted(self.pending.items()):
            ch = _channel(item)
            if ch in blocked:
                continue
            t = self.tries.get(nid)
            if t is not None and t.next_ms > now:
                left = (t.next_ms - now) / 1000
                due_in = left if due_in is None else min(due_in, left)
                if ch:
                    blocked.add(ch)  # its later documents wait for it
                continue
            return item, None
        return None, due_in

    def _run_one(self, item: Any) -> None:
        from semq.node.features.receiving import acknowledge, failed

        try:
            fresh = self.node.get(item.id)
        except KeyError:
            fresh = None
        if fresh is None or fresh.consumed_ms is not None:
            self.pending.pop(item.id, None)  # acknowledged by someone else meanwhile
            return
        out = run_command(self.command, item, self.timeout)
        if out.ok:
            acknowledge(self.node, item)
            self.pending.pop(item.id, None)
            self.tries.pop(item.id, None)
            self.done += 1
            print(f"{item.id} {item.lk0}: acknowledged", file=sys.stderr, flush=True)
            return
        before = self.tries.get(item.id)
        n = (before.tries if before else 0) + 1
        park = n >= self.max_tries
        delay = min(MAX_BACKOFF, self.backoff * 2 ** (n - 1))
        t = failed(self.node, item, code=out.code if out.code is not None else -9, stderr_tail=out.stderr,
                   next_ms=int((time.time() + delay) * 1000), park=park)
        self.tries[item.id] = t
        what = _describe(out.code, out.timed_out)
        if park:
            self.pending.pop(item.id, None)
            ch = _channel(item)
            if ch:
                self.held.add(ch)
            print(f"{item.id} {item.lk0}: {what}; parked after {t.tries} {'try' if t.tries == 1 else 'tries'}"
                  f" (semq receive --parked; --retry {item.id})"
                  + (f"; the later documents of channel {ch[1]} from {ch[0]} wait for it" if ch else ""),
                  file=sys.stderr, flush=True)
        else:
            print(f"{item.id} {item.lk0}: {what}; try {t.tries} of {self.max_tries}, next in {delay:g} s",
                  file=sys.stderr, flush=True)

    def run(self) -> int:
        from semq.session.inbox_wait import MAX_WAIT, DaemonAway

        node = self.node
        self._load(clean=True)
        cursor = node.cursor(0)
        away = False
        print(f"receiving for {node.org}{f' user {self.user}' if self.user else ''}: sh -c {self.command!r}"
              f" per document (max {self.max_tries} tries)", file=sys.stderr, flush=True)
        while True:
            for item in node.inbox_after(cursor, user=self.user):
                cursor = node.advance(cursor, item)
                t = self.tries.get(item.id)
                if t is None or t.parked_ms is None:
                    self.pending[item.id] = item
            item, due_in = self._next()
            if item is not None:
                self._run_one(item)
                continue
            if self.once:
                return 0
            span = MAX_WAIT if due_in is None else max(0.01, min(MAX_WAIT, due_in))
            try:
                node.wait(cursor, user=self.user, timeout=span)
            except DaemonAway as e:
                if not away:
                    print(f"note: {e}: waiting for the node daemon, trying again every second", file=sys.stderr,
                          flush=True)
                    away = True
                time.sleep(min(1.0, span))
                continue
            away = False
            self._refresh()


def cmd_receive(args: argparse.Namespace) -> int:
    if args.parked:
        return _parked(args)
    if args.retry:
        return _retry(args)
    if not args.exec:
        raise UsageError("semq receive needs --exec CMD (or --parked, --retry ID)")
    if args.max_tries < 1:
        raise UsageError(f"--max-tries {args.max_tries} is below 1")
    if not 0 < args.backoff <= MAX_BACKOFF:
        raise UsageError(f"--backoff {args.backoff:g} is outside (0, {MAX_BACKOFF:g}] seconds")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g} must be above 0 seconds")

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with client_of(args) as node:
        receiver = Receiver(node, args)
        try:
            return receiver.run()
        except KeyboardInterrupt:
            print(f"stopped after {receiver.done} document(s); the one running (if any) is run again at the next"
                  " start", file=sys.stderr)
            return 130


def _parked(args: argparse.Namespace) -> int:
    from semq.node.features.receiving import parked

    with client_of(args) as node:
        rows = parked(node)
    if args.json:
        print(json.dumps([{"id": t.inbox_id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id,
                           "channel": i.channel, "app_key": str(i.app_key), "tries": t.tries,
                           "last_code": t.last_code, "stderr_tail": t.stderr_tail, "first_ms": t.first_ms,
                           "last_ms": t.last_ms, "parked_ms": t.parked_ms} for t, i in rows]))
        return 0
    print(f"{'ID':>6}  {'LK0':<28} {'APPKEY':<32} {'TRIES':>5} {'LAST':<12} {'PARKED':<19}  STDERR")
    for t, i in rows:
        tail = shown(" ".join(t.stderr_tail.split())[-60:])
        print(f"{t.inbox_id:>6}  {i.lk0!s:<28} {app_key_shown(i.app_key):<32} {t.tries:>5}"
              f" {_describe(t.last_code, False):<12} {format_time(t.parked_ms):<19}  {tail}")
    print(f"{len(rows)} parked document(s); 'semq receive --retry ID' gives one back", file=sys.stderr)
    return 0


def _retry(args: argparse.Namespace) -> int:
    from semq.node.features.receiving import retry

    rc = 0
    with client_of(args) as node:
        for text in args.retry:
            try:
                retry(node, doc_id(text))
            except KeyError as e:
                print(f"error: {e.args[0]}", file=sys.stderr)
                rc = 1
                continue
            print(f"document {text} is due again (its tries start from 0); a running 'semq receive' takes it"
                  " within 30 s, else the next one started")
    return rc


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq receive``."""
    x = sub.add_parser(
        "receive", parents=[common], help="run a command for each document as it arrives",
        description=textwrap.fill(
            "Run 'sh -c CMD' once per document as documents arrive (woken by the node daemon, no"
            " polling): the document on stdin, its metadata in SEMQ_* environment variables. Exit 0"
            " acknowledges it; anything else tries it again with exponential backoff, and after"
            " --max-tries it is parked. At least once: a document whose command was interrupted is"
            " run again.", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment of CMD: SEMQ_ID SEMQ_LK0 SEMQ_FROM SEMQ_FROM_USER SEMQ_TO_USER SEMQ_CHANNEL\n"
               "  SEMQ_DOMAIN SEMQ_TYPE SEMQ_SUBTYPE SEMQ_KEY SEMQ_SIZE SEMQ_RECEIVED (ms since the epoch).\n"
               "  They come from the sending organization: use them as \"$SEMQ_KEY\" (quoted), never paste\n"
               "  them into a command line of your own.\n\n"
               "examples:\n"
               "  semq receive --dir B --exec 'cat > \"orders/$SEMQ_ID.xml\"'\n"
               "  semq receive --dir B --exec 'book-order --key \"$SEMQ_KEY\"' --max-tries 8 --backoff 2 --timeout 60\n"
               "  semq receive --dir B --parked          # documents given up on, with their last stderr\n"
               "  semq receive --dir B --retry 17        # give document 17 back to the running receive")
    x.add_argument("--exec", metavar="CMD", help="the command run once per document with sh -c")
    x.add_argument("--max-tries", type=int, default=5, metavar="N",
                   help="park a document after N failed runs (default 5)")
    x.add_argument("--backoff", type=float, default=1.0, metavar="S",
                   help=f"seconds before the 2nd run of a failed document, doubling each run (default 1, at most"
                        f" {MAX_BACKOFF:g})")
    x.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="kill a run (and what it started) after S seconds; counts as a failed run (default: none)")
    x.add_argument("--once", action="store_true",
                   help="run the documents there are, and those due, then exit instead of waiting for more")
    x.add_argument("--parked", action="store_true", help="list the parked documents (with --json for programs)")
    x.add_argument("--retry", nargs="+", metavar="ID", help="give parked documents back: due now, tries from 0")
    x.add_argument("--json", action="store_true", help="--parked: JSON")
    x.add_argument("--user", metavar="NAME",
                   help="only the documents for this user of the node (semq receive runs as the node's operator:"
                        " it opens the store; a user's application follows with 'semq inbox --follow' and a token)")
    x.set_defaults(func=cmd_receive)
