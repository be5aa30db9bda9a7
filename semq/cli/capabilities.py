"""Commands for transactional messages, request/reply, dead letters and
local queues (the capabilities the seeds 000, 001, 002 and 004 describe:
docs/seed-capabilities.md), added to ``semq`` by ``register(subparsers)``:

    semq tx send|commit|rollback|list|show|check|watch|config
    semq request / semq reply / semq requests / semq replies
    semq dead [list]|requeue|purge|sweep|config
    semq queue create|destroy|put|get|ack|release|recover|list

Conventions of semq.cli: ``--dir`` on every command, one ``error: ...``
line on stderr; exit 0 ok, 1 runtime failure, 2 a user's mistake (these
modules raise ValueError subclasses for those, which ``semq.cli.main``
turns into exit 2), 3 "nothing came": a request without a reply in time,
an empty queue. ``python -m semq.cli.features`` runs them (semq.cli.features).
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Final

from semq.cli._common import format_age
from semq.cli._common import positive_seconds as _positive
from semq.ops.display import MAX_LIMIT, check_count, is_time_key, shown, when
from semq.settings.config import ConfigError, data_dir, load_config

__all__ = ["EXIT_NOTHING", "register"]

EXIT_NOTHING: Final = 3  # no reply within the timeout / nothing in the queue


class FeatureUsageError(ValueError):
    """Bad arguments: exit 2 through semq.cli.main."""


# ---------------------------------------------------------------- helpers


def _dir(args: argparse.Namespace) -> Path:
    return data_dir(getattr(args, "dir", None))


def _client(args: argparse.Namespace) -> Any:
    from semq.node.api import NodeClient

    cfg = load_config(_dir(args))
    if cfg.role != "node":
        raise ConfigError(f"{cfg.directory} holds a {cfg.role}, not a node")
    return NodeClient(cfg.directory, config=cfg)


def _read(file: str) -> bytes:
    if file == "-":
        return sys.stdin.buffer.read()
    p = Path(file)
    if not p.is_file():
        raise FeatureUsageError(f"no such file: {file}")
    return p.read_bytes()


def _write_out(data: bytes, out: str | None) -> None:
    if out:
        Path(out).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def _until(ms: int | None) -> str:
    if not ms:
        return "-"
    s = ms / 1000 - time.time()
    return "due" if s <= 0 else f"in {s:.0f}s" if s < 120 else f"in {s / 60:.0f}m"


def _daemon_running(directory: Path) -> bool:
    """The node daemon writes status.json every second while it runs."""
    try:
        st = json.loads((directory / "status.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool(time.time() * 1000 - st.get("time_ms", 0) <= 5000)


def _doc_options(x: argparse.ArgumentParser, *, save_fwd: bool = True) -> None:
    if save_fwd:
        x.add_argument("--save-fwd", type=int, default=3, choices=[1, 2, 3],
                       help="target offline: 1 drop, 2 store at the platform, 3 must be delivered (default;"
                            " semq help savefwd)")
    x.add_argument("--priority", type=int, help="0-9, higher first")
    x.add_argument("--expires-in", type=_positive, help="seconds until the document expires")
    x.add_argument("--no-encrypt", action="store_true",
                   help="signed but NOT end-to-end private: the platform operator can read it")
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")


# ---------------------------------------------------------------- tx


def _tx_row(m: Any) -> dict[str, Any]:
    return {"id": m.id, "state": m.state.name, "to": m.target, "app_key": str(m.app_key), "size": len(m.app_data),
            "priority": m.priority, "created_ms": m.created_ms, "state_ms": m.state_ms, "checks": m.checks,
            "next_check_ms": m.next_check_ms, "lk0": str(m.lk0) if m.lk0 else None,
            "decided_by": m.decided_by, "note": m.note}


def cmd_tx_send(args: argparse.Namespace) -> int:
    from semq.node.features.txn import Transactions

    data = _read(args.file)
    with _client(args) as node:
        txs = Transactions(node)
        m = txs.send(args.to, data, data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
                     save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority or 0,
                     expires_in=args.expires_in, encrypt=not args.no_encrypt)
        s = txs.settings
    print(m.id)
    if not args.quiet:
        ask = f"'{s.checkback}'" if s.checkback else "nobody (no check-back configured: semq tx config --checkback)"
        print(f"half message {m.id} stored for {args.to} ({len(data)} bytes); NOT sent until"
              f" 'semq tx commit {m.id}'. Undecided after {s.first_check:g} s, the node asks {ask}",
              file=sys.stderr)
    return 0


def cmd_tx_commit(args: argparse.Namespace) -> int:
    from semq.node.features.txn import Transactions

    with _client(args) as node:
        lk0 = Transactions(node).commit(args.id, by="cli")
    print(lk0)
    if not args.quiet:
        print(f"transaction {args.id} committed: {lk0} is in the pending-send table", file=sys.stderr)
    return 0


def cmd_tx_rollback(args: argparse.Namespace) -> int:
    from semq.node.features.txn import Transactions

    with _client(args) as node:
        Transactions(node).rollback(args.id, by="cli", note=args.note)
    print(f"transaction {args.id} rolled back: it will never be sent")
    return 0


def cmd_tx_list(args: argparse.Namespace) -> int:
    from semq.node.features.txn import Transactions

    with _client(args) as node:
        rows = Transactions(node).list(states=None if args.all else _open(),
                                       limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))
    if args.json:
        print(json.dumps([_tx_row(m) for m in rows]))
        return 0
    print(f"{'ID':>5}  {'STATE':<15} {'TO':<10} {'CHECKS':>6}  {'NEXT':<8} {'AGE':>5}  {'APPKEY':<28} NOTE / LK0")
    for m in rows:
        tail = str(m.lk0) if m.lk0 else m.note
        print(f"{m.id:>5}  {m.state.name:<15} {m.target:<10} {m.checks:>6}  {_until(m.next_check_ms):<8}"
              f" {format_age(m.created_ms):>5}  {shown(m.app_key):<28} {shown(tail)}")
    attention = sum(1 for m in rows if m.state.name == "NEEDS_ATTENTION")
    print(f"{len(rows)} transaction(s)" + (f"; {attention} NEED A PERSON: semq tx commit|rollback ID"
                                            if attention else ""), file=sys.stderr)
    return 0


def _open() -> Any:
    from semq.node.features.txn import TxState

    return (TxState.HALF, TxState.NEEDS_ATTENTION)


def cmd_tx_show(args: argparse.Namespace) -> int:
    from semq.node.features.txn import Transactions

    with _client(args) as node:
        m = Transactions(node).get(args.id)
    if args.data:
        _write_out(m.app_data, None)
        return 0
    for k, v in _tx_row(m).items():
        print(f"{k}: {when(v) if is_time_key(k) and isinstance(v, int) else shown(v)}")
    return 0


def cmd_tx_check(args: argparse.Namespace) -> int:
    from semq.node.features.txn import TxChecker

    with _client(args) as node:
        report = TxChecker(node).run_due()
    if args.json:
        print(json.dumps({"asked": report.asked, "committed": [[i, str(lk)] for i, lk in report.committed],
                          "rolled_back": report.rolled_back, "unknown": report.unknown,
                          "flagged": report.flagged, "skipped": report.skipped,
                          "errors": [list(e) for e in report.errors]}))
    else:
        print(report.summary())
    return 0


def cmd_tx_watch(args: argparse.Namespace) -> int:
    import trio

    from semq.node.features.tasks import run_checkbacks

    d = load_config(_dir(args)).directory

    async def amain() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                nursery.start_soon(run_checkbacks, d, args.interval)
                print(f"checking back on half messages of {d} every {args.interval:g} s", flush=True)
                async for _sig in signals:
                    break
                nursery.cancel_scope.cancel()

    trio.run(amain)
    return 0


def cmd_tx_config(args: argparse.Namespace) -> int:
    from semq.node.features.capabilities import load_capabilities, update_capabilities

    d = load_config(_dir(args)).directory
    # The first check-back may be at once (0); the others need a period.
    check_count(args.first_check, "--first-check", 0.0, 86400.0 * 365)
    for value, option in ((args.check_interval, "--check-interval"), (args.checkback_timeout, "--checkback-timeout")):
        check_count(value, option, 0.001, 86400.0 * 365)
    check_count(args.max_checks, "--max-checks", 1, 1_000_000)
    changes = {k: v for k, v in (("checkback", args.checkback), ("first_check", args.first_check),
                                 ("check_interval", args.check_interval), ("max_checks", args.max_checks),
                                 ("checkback_timeout", args.checkback_timeout)) if v is not None}
    caps = update_capabilities(d, tx=changes) if changes else load_capabilities(d)
    s = caps.tx
    print(f"checkback = {s.checkback!r}\nfirst_check = {s.first_check:g} s\ncheck_interval = {s.check_interval:g} s"
          f"\nmax_checks = {s.max_checks}\ncheckback_timeout = {s.checkback_timeout:g} s")
    return 0


# ---------------------------------------------------------------- request / reply


def cmd_request(args: argparse.Namespace) -> int:
    from semq.node.features import rpc

    data = _read(args.file)
    with _client(args) as node:
        lk0 = rpc.send_request(node, args.to, data, data_type=args.type, key=args.key,
                               priority=args.priority or 0, save_fwd=args.save_fwd, expires_in=args.expires_in,
                               encrypt=not args.no_encrypt, timeout=None if args.no_wait else args.timeout)
        if args.no_wait:
            print(lk0)
            if not args.quiet:
                print(f"request {lk0} queued for {args.to}; its reply: semq replies --take {lk0}", file=sys.stderr)
            return 0
        running = _daemon_running(node.config.directory)
        if not running and not args.quiet:
            print("warning: the node daemon is not running (semq node run): the request waits in the"
                  " pending-send table", file=sys.stderr)
        try:
            got = rpc.wait_reply(node, lk0, args.timeout)
        except rpc.ReplyTimeout as e:
            print(f"error: {e}" + ("" if running else " (the node daemon is not running)"), file=sys.stderr)
            return EXIT_NOTHING
    _write_out(got.data, args.out)
    if not args.quiet:
        print(f"reply {got.lk0} from {args.to} to request {lk0}: {len(got.data)} bytes"
              f" after {(got.item.received_ms - got.item.created_ms) / 1000:.2f} s in transit", file=sys.stderr)
    return 0


def cmd_reply(args: argparse.Namespace) -> int:
    from semq.node.features import rpc

    data = _read(args.file)
    with _client(args) as node:
        lk0 = rpc.reply(node, args.to_request, data, data_type=args.type, priority=args.priority,
                        save_fwd=args.save_fwd, expires_in=args.expires_in, encrypt=not args.no_encrypt)
    print(lk0)
    if not args.quiet:
        print(f"reply {lk0} to request {args.to_request} queued ({len(data)} bytes)", file=sys.stderr)
    return 0


def cmd_requests(args: argparse.Namespace) -> int:
    from semq.node.features import rpc

    with _client(args) as node:
        rows = rpc.incoming(node, include_answered=args.all, limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))
    if args.json:
        print(json.dumps([{"id": it.id, "lk0": str(it.lk0), "from": it.lk0.endpoint.node_id,
                           "type": it.app_key.data_type, "key": it.app_key.key, "size": it.size,
                           "received_ms": it.received_ms, "reply": str(r) if r else None} for it, r in rows]))
        return 0
    print(f"{'ID':>6}  {'FROM':<10} {'REQUEST LK0':<28} {'TYPE':<14} {'SIZE':>7}  {'AGE':>5}  REPLY")
    for it, r in rows:
        print(f"{it.id:>6}  {it.lk0.endpoint.node_id:<10} {it.lk0!s:<28} {shown(it.app_key.data_type):<14}"
              f" {it.size:>7}  {format_age(it.received_ms):>5}  {r or '-'}")
    print(f"{len(rows)} request(s); answer with: semq reply --to-request ID FILE", file=sys.stderr)
    return 0


def cmd_replies(args: argparse.Namespace) -> int:
    from semq.node.features import rpc

    with _client(args) as node:
        if args.take:
            got = rpc.take_reply(node, args.take)
            _write_out(got.data, args.out)
            if not args.quiet:
                print(f"reply {got.lk0} to request {got.request}: {len(got.data)} bytes", file=sys.stderr)
            return 0
        rows = rpc.replies(node, include_taken=args.all, limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))
        stray = rpc.unmatched_replies(node)
        replies: dict[int, str] = {}
        for r in rows:
            if r.reply_inbox_id is not None:
                try:
                    replies[r.reply_inbox_id] = str(node.get(r.reply_inbox_id).lk0)
                except KeyError:
                    replies[r.reply_inbox_id] = "(purged)"
    if args.json:
        print(json.dumps({
            "requests": [{"request": str(r.lk0), "to": r.target, "type": r.data_type, "state": r.state,
                          "sent_ms": r.sent_ms, "reply_inbox_id": r.reply_inbox_id,
                          "reply": replies.get(r.reply_inbox_id) if r.reply_inbox_id else None,
                          "replied_ms": r.replied_ms} for r in rows],
            "unmatched": [{"id": it.id, "lk0": str(it.lk0), "from": it.lk0.endpoint.node_id, "key": it.app_key.key,
                           "why": why} for it, why in stray]}))
        return 0
    print(f"{'REQUEST LK0':<28} {'TO':<10} {'TYPE':<14} {'STATE':<8} {'AGE':>5}  REPLY")
    for r in rows:
        rep = f"{replies[r.reply_inbox_id]} (inbox {r.reply_inbox_id})" if r.reply_inbox_id else "-"
        print(f"{r.lk0!s:<28} {r.target:<10} {shown(r.data_type):<14} {r.state:<8} {format_age(r.sent_ms):>5}"
              f"  {rep}")
    for it, why in stray:
        print(f"unmatched reply {it.lk0} (inbox {it.id}) from {it.lk0.endpoint.node_id}: {shown(why)}")
    print(f"{len(rows)} request(s); take a reply with: semq replies --take REQUEST_LK0", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- dead letters


def _ids(args: argparse.Namespace, what: str) -> list[str] | None:
    if args.all and args.ids:
        raise FeatureUsageError(f"dead {what}: give IDs or --all, not both")
    if not args.all and not args.ids:
        raise FeatureUsageError(f"dead {what} needs document IDs (record id or LK0) or --all")
    return None if args.all else list(args.ids)


def _why_failed(directory: Path, lk0s: list[str]) -> dict[str, str]:
    """What the refusing side said of each dead letter (``bob is not a user
    of organization 56001``), from the delivery history: the detail of its
    last failing step. Missing for a document the history does not hold
    (history_days = 0, not indexed yet)."""
    from semq.tracking.history import HistoryReader, history_paths

    paths = history_paths(directory)
    if not paths or not lk0s:
        return {}
    reader = HistoryReader(paths)
    out: dict[str, str] = {}
    try:
        for lk0 in lk0s:
            for row in reader.document(lk0):
                said = [s["detail"] for s in row["steps"] if row["role"] == "origin" and s.get("detail")
                        and s["event"] in ("nack", "expired", "dead")]
                if said:
                    out[lk0] = said[-1]
    finally:
        reader.close()
    return out


def cmd_dead_list(args: argparse.Namespace) -> int:
    from semq.node.features.dead import DeadLetters

    with _client(args) as node:
        rows = DeadLetters(node).list(limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))
        said = _why_failed(node.config.directory, [str(d.lk0) for d in rows])

    def why(d: Any) -> str:
        detail = said.get(str(d.lk0), "")
        return f"{d.reason}: {detail}" if detail and detail != d.reason else d.reason

    if args.json:
        print(json.dumps([{"lk0": str(d.lk0), "to": d.target, "code": d.code, "reason": d.reason,
                           "detail": said.get(str(d.lk0), ""),
                           "app_key": str(d.app_key), "attempts": d.attempts, "created_ms": d.created_ms,
                           "failed_ms": d.failed_ms, "expires_ms": d.expires_ms, "size": d.size} for d in rows]))
        return 0
    print(f"{'LK0':<28} {'TO':<10} {'CODE':>4} {'TRIES':>5} {'AGE':>5}  {'APPKEY':<24}  REASON")
    for d in rows:
        print(f"{d.lk0!s:<28} {d.target:<10} {d.code:>4} {d.attempts:>5} {format_age(d.created_ms):>5}"
              f"  {shown(d.app_key):<24}  {shown(why(d))}")
    print(f"{len(rows)} dead letter(s); semq dead requeue|purge ID...|--all", file=sys.stderr)
    return 0


def cmd_dead_requeue(args: argparse.Namespace) -> int:
    from semq.node.features.dead import DeadLetters

    refs = _ids(args, "requeue")
    if args.expires_in is not None and args.no_expiry:
        raise FeatureUsageError("dead requeue: --expires-in and --no-expiry exclude each other")
    with _client(args) as node:
        res = DeadLetters(node).requeue(refs, expires_in=args.expires_in, no_expiry=args.no_expiry)
    for lk in res.requeued:
        print(lk)
    print(f"requeued {len(res.requeued)}", file=sys.stderr)
    if res.skipped_expired:
        print(f"skipped {len(res.skipped_expired)} expired: {', '.join(map(str, res.skipped_expired))}"
              " (requeue them with --expires-in SECONDS or --no-expiry)", file=sys.stderr)
    return 0


def cmd_dead_purge(args: argparse.Namespace) -> int:
    from semq.node.features.dead import DeadLetters

    refs = _ids(args, "purge")
    with _client(args) as node:
        n = DeadLetters(node).purge(refs)
    print(f"purged {n}")
    return 0


def cmd_dead_sweep(args: argparse.Namespace) -> int:
    from semq.node.features.capabilities import load_capabilities
    from semq.node.features.dead import sweep

    with _client(args) as node:
        check_count(args.max_attempts, "--max-attempts", 1, 1_000_000)
        limit = args.max_attempts if args.max_attempts is not None else \
            load_capabilities(node.config.directory).dead.max_attempts
        if limit <= 0:
            raise FeatureUsageError("dead sweep needs --max-attempts N (or [dead] max_attempts in capabilities.toml)")
        n = sweep(node, limit)
    print(f"{n} document(s) with {limit} or more attempts moved to the dead letters")
    return 0


def cmd_dead_config(args: argparse.Namespace) -> int:
    from semq.node.features.capabilities import load_capabilities, update_capabilities

    d = load_config(_dir(args)).directory
    check_count(args.max_attempts, "--max-attempts", 0, 1_000_000)
    caps = (update_capabilities(d, dead={"max_attempts": args.max_attempts}) if args.max_attempts is not None
            else load_capabilities(d))
    n = caps.dead.max_attempts
    print(f"max_attempts = {n}" + (" (never give up)" if n == 0 else ""))
    return 0


# ---------------------------------------------------------------- queues


def cmd_queue(args: argparse.Namespace) -> int:
    from semq.node.features.queues import LocalQueues

    node = _client(args)
    try:
        q = LocalQueues(node)
        return _queue_action(args, q)
    finally:
        node.close()


def _queue_action(args: argparse.Namespace, q: Any) -> int:
    act = args.qaction
    if act == "create":
        made = q.create(args.name, exist_ok=args.exist_ok)
        print(f"queue {args.name} {'created' if made else 'exists already'}")
    elif act == "destroy":
        n = q.destroy(args.name, force=args.force)
        print(f"queue {args.name} destroyed" + (f" with {n} item(s)" if n else ""))
    elif act == "put":
        print(q.enqueue(args.name, _read(args.file)))
    elif act == "get":
        check_count(args.wait, "--wait", 0, 86400.0)
        deadline = time.monotonic() + args.wait
        while True:
            item = q.dequeue(args.name, lease=args.lease)
            if item is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if item is None:
            print(f"queue {args.name} has no visible item" + (f" (waited {args.wait:g} s)" if args.wait else ""),
                  file=sys.stderr)
            return EXIT_NOTHING
        if args.json:
            print(json.dumps({"queue": item.queue, "id": item.id, "delivery": item.delivery,
                              "lease_until_ms": item.lease_until_ms, "enqueued_ms": item.enqueued_ms,
                              "data": base64.b64encode(item.data).decode()}))
        elif args.out:
            Path(args.out).write_bytes(item.data)
            print(item.id)
        else:
            _write_out(item.data, None)
        if not args.json:
            print(f"item {item.id} of {args.name} (delivery {item.delivery}) leased for {args.lease:g} s;"
                  f" when done: semq queue ack {args.name} {item.id}", file=sys.stderr)
    elif act == "ack":
        for i in args.ids:
            q.ack(args.name, i, delivery=args.delivery)
        print(f"acknowledged {len(args.ids)}")
    elif act == "release":
        for i in args.ids:
            q.release(args.name, i)
        print(f"released {len(args.ids)}")
    elif act == "recover":
        if bool(args.all) == bool(args.name):
            raise FeatureUsageError("queue recover needs a queue NAME or --all")
        n = q.recover(None if args.all else args.name)
        print(f"recovered {n} in-flight item(s)")
    elif act == "list":
        stats = q.stats()
        if args.json:
            print(json.dumps([s.__dict__ for s in stats]))
            return 0
        print(f"{'QUEUE':<24} {'READY':>7} {'IN FLIGHT':>9} {'LEASE OVER':>10} {'OLDEST':>7} {'MAX DELIV':>9}")
        for s in stats:
            print(f"{s.name:<24} {s.ready:>7} {s.in_flight:>9} {s.expired_leases:>10} {format_age(s.oldest_ms):>7}"
                  f" {s.max_delivery:>9}")
        print(f"{len(stats)} queue(s)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- parser


def register(sub: Any) -> None:
    """Add the commands to semq's subparsers (``build_parser`` calls this)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    _register_tx(sub, common)
    _register_rpc(sub, common)
    _register_dead(sub, common)
    _register_queue(sub, common)


def _register_tx(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq tx``: transactional messages."""
    tx = sub.add_parser("tx", help="transactional (half) messages: send, then commit or roll back")
    txs = tx.add_subparsers(dest="sub", required=True)
    x = txs.add_parser("send", parents=[common], help="store a half message (not sent until commit)")
    x.add_argument("--to", required=True, help="target organization id")
    x.add_argument("--type", required=True, help="AppKey data type, e.g. ORDER")
    x.add_argument("--domain", default="", help="AppKey domain, e.g. trade")
    x.add_argument("--subtype", default="", help="AppKey subtype, e.g. PO")
    x.add_argument("--key", default="", help="AppKey key: your reference, e.g. the order number")
    x.add_argument("--ack2", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the receiver for an end-to-end confirmation (default on; semq help ack2)")
    _doc_options(x)
    x.add_argument("file", help="file to send, or - for stdin")
    x.set_defaults(func=cmd_tx_send)
    x = txs.add_parser("commit", parents=[common], help="send it: move it into the pending-send table")
    x.add_argument("id", type=int, help="the half message's id (semq tx send printed it)")
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")
    x.set_defaults(func=cmd_tx_commit)
    x = txs.add_parser("rollback", parents=[common], help="never send it")
    x.add_argument("id", type=int, help="the half message's id")
    x.add_argument("--note", default="", help="why (kept with it)")
    x.set_defaults(func=cmd_tx_rollback)
    x = txs.add_parser("list", parents=[common], help="undecided half messages (and those needing a person)")
    x.add_argument("--all", action="store_true", help="include committed and rolled-back ones")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    x.set_defaults(func=cmd_tx_list)
    x = txs.add_parser("show", parents=[common], help="one half message")
    x.add_argument("id", type=int, help="the half message's id")
    x.add_argument("--data", action="store_true", help="write its document to stdout")
    x.set_defaults(func=cmd_tx_show)
    x = txs.add_parser("check", parents=[common], help="run the check-backs that are due, once")
    x.add_argument("--json", action="store_true", help="what was asked and decided, as JSON")
    x.set_defaults(func=cmd_tx_check)
    x = txs.add_parser("watch", parents=[common], help="run check-backs in the foreground until stopped")
    x.add_argument("--interval", type=_positive, default=1.0, metavar="S",
                   help="seconds between rounds of check-backs (default 1)")
    x.set_defaults(func=cmd_tx_watch)
    x = txs.add_parser("config", parents=[common], help="show or set the check-back and its schedule")
    x.add_argument("--checkback", help="shell command answering commit / rollback (\"\" = none)")
    x.add_argument("--first-check", type=float, help="s before the first check-back (default 6)")
    x.add_argument("--check-interval", type=float, help="s between check-backs (default 60)")
    x.add_argument("--max-checks", type=int, help="check-backs before a person is asked (default 15)")
    x.add_argument("--checkback-timeout", type=float, help="s the command may take (default 10)")
    x.set_defaults(func=cmd_tx_config)


def _register_rpc(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq request``, ``reply``, ``requests``, ``replies``: request/reply."""
    x = sub.add_parser("request", parents=[common], help="send a request and wait for its reply")
    x.add_argument("--to", required=True, help="target organization id")
    x.add_argument("--type", required=True, help="AppKey data type, e.g. PRICE_INQUIRY")
    x.add_argument("--key", default="", help="your own reference (AppKey key of the request)")
    x.add_argument("--timeout", type=_positive, default=10.0, help="seconds to wait (default 10)")
    x.add_argument("--no-wait", action="store_true", help="asynchronous: print the request's LK0 and return")
    x.add_argument("--out", metavar="FILE", help="write the reply to FILE instead of stdout")
    _doc_options(x)
    x.add_argument("file", help="file to send, or - for stdin")
    x.set_defaults(func=cmd_request)
    x = sub.add_parser("reply", parents=[common], help="answer a request that arrived")
    x.add_argument("--to-request", type=int, required=True, metavar="INBOX_ID",
                   help="the request's id in the inbox (semq requests lists them)")
    x.add_argument("--type", help="AppKey data type (default: the request's)")
    _doc_options(x)
    x.add_argument("file", help="file to send, or - for stdin")
    x.set_defaults(func=cmd_reply)
    x = sub.add_parser("requests", parents=[common], help="requests that arrived, not yet answered")
    x.add_argument("--all", action="store_true", help="include answered ones")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values")
    x.set_defaults(func=cmd_requests)
    x = sub.add_parser("replies", parents=[common], help="our requests and their replies")
    x.add_argument("--all", action="store_true", help="include replies already taken")
    x.add_argument("--take", metavar="REQUEST_LK0", help="print the reply to this request and mark it taken")
    x.add_argument("--out", metavar="FILE", help="with --take: write the reply to FILE")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values")
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")
    x.set_defaults(func=cmd_replies)


def _register_dead(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq dead``: dead letters."""
    dead = sub.add_parser("dead", parents=[common], help="documents that will not be delivered, and why")
    dead.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N (1..{MAX_LIMIT}, default 100)")
    dead.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    dead.set_defaults(func=cmd_dead_list)
    ds = dead.add_subparsers(dest="sub")
    x = ds.add_parser("list", parents=[common], help="the dead letters with their reasons (default)")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    x.set_defaults(func=cmd_dead_list)
    x = ds.add_parser("requeue", parents=[common], help="send them again (same LK0)")
    x.add_argument("ids", nargs="*", help="record ids or LK0s")
    x.add_argument("--all", action="store_true", help="every dead letter")
    x.add_argument("--expires-in", type=_positive, help="a new expiry, seconds from now")
    x.add_argument("--no-expiry", action="store_true", help="remove the expiry")
    x.set_defaults(func=cmd_dead_requeue)
    x = ds.add_parser("purge", parents=[common], help="delete them")
    x.add_argument("ids", nargs="*", help="record ids or LK0s")
    x.add_argument("--all", action="store_true", help="every dead letter")
    x.set_defaults(func=cmd_dead_purge)
    x = ds.add_parser("sweep", parents=[common], help="unsent documents with too many attempts become dead")
    x.add_argument("--max-attempts", type=int, metavar="N",
                   help="N attempts or more (default: the configured rule, semq dead config)")
    x.set_defaults(func=cmd_dead_sweep)
    x = ds.add_parser("config", parents=[common], help="show or set the max-attempts rule (0 = off)")
    x.add_argument("--max-attempts", type=int, metavar="N", help="set it: a document with N attempts is given up"
                   " (0: never)")
    x.set_defaults(func=cmd_dead_config)


def _register_queue(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq queue``: local queues."""
    q = sub.add_parser("queue", help="named local durable queues in the node's store")
    qs = q.add_subparsers(dest="qaction", required=True)
    x = qs.add_parser("create", parents=[common], help="create a queue")
    x.add_argument("name", help="the queue's name")
    x.add_argument("--exist-ok", action="store_true", help="a queue of that name already there is no error")
    x = qs.add_parser("destroy", parents=[common], help="delete a queue")
    x.add_argument("name", help="the queue's name")
    x.add_argument("--force", action="store_true", help="also when it holds items (they are deleted)")
    x = qs.add_parser("put", parents=[common], help="enqueue FILE (or - for stdin); prints the item id")
    x.add_argument("name", help="the queue's name")
    x.add_argument("file", help="the item's content: a file, or - for stdin")
    x = qs.add_parser("get", parents=[common], help="dequeue one item (leased until acked)")
    x.add_argument("name", help="the queue's name")
    x.add_argument("--lease", type=_positive, default=30.0, help="seconds it stays invisible to others")
    x.add_argument("--wait", type=float, default=0.0, help="seconds to wait for an item")
    x.add_argument("--out", metavar="FILE", help="write the item to FILE and print its id")
    x.add_argument("--json", action="store_true", help="id, delivery and base64 data as JSON")
    x = qs.add_parser("ack", parents=[common], help="done with dequeued items: delete them")
    x.add_argument("name", help="the queue's name")
    x.add_argument("ids", nargs="+", type=int, help="the items' ids (semq queue get printed them)")
    x.add_argument("--delivery", type=int, help="refuse if the item was dequeued again since this delivery")
    x = qs.add_parser("release", parents=[common], help="give dequeued items back at once")
    x.add_argument("name", help="the queue's name")
    x.add_argument("ids", nargs="+", type=int, help="the items' ids")
    x = qs.add_parser("recover", parents=[common], help="after a crash: every in-flight item back to the queue")
    x.add_argument("name", nargs="?", default="", help="the queue's name (or --all)")
    x.add_argument("--all", action="store_true", help="of every queue")
    x = qs.add_parser("list", parents=[common], help="queues with their counts")
    x.add_argument("--json", action="store_true", help="as JSON")
    for p in qs.choices.values():
        p.set_defaults(func=cmd_queue)
