"""``semq status`` (a node's or the platform's: its daemon, its store's
counts, its certificate) and ``semq messages`` (the pending-send rows, a
document's receipt)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from semq.cli._common import UsageError, client_of, config_of, daemon_status, format_age
from semq.cli.bulk import format_size
from semq.ops.display import MAX_LIMIT, check_count, counts_shown, is_time_key, plain, shown, when
from semq.ops.runtime import live_status
from semq.settings.config import Config

__all__ = ["cmd_messages", "cmd_status", "register"]


def cmd_messages(args: argparse.Namespace) -> int:
    if args.receipt:
        from semq.umxt_protocol import LK0

        text = args.receipt
        rid = int(text) if text.isdigit() else LK0.parse(text).record_id
        with client_of(args) as node:
            try:
                info = node.receipt(rid)
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
        if args.json:
            print(json.dumps(info))
        else:
            for k, v in info.items():
                print(f"{k}: {when(v) if is_time_key(k) and isinstance(v, int) else shown(v)}")
        return 0 if info.get("verified") else 1
    from semq.identity.security import waiting_reason
    from semq.node.engine import SendState

    with client_of(args) as node:
        rows = node.messages(limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))

    def reason(r: Any) -> str:
        # A document to a known organization without a usable certificate
        # waits (SS_INIT) with the reason in its code.
        return waiting_reason(r.target, r.code) if r.state is SendState.SS_INIT and r.code else ""

    if args.json:
        print(json.dumps([{"lk0": str(r.lk0), "target": r.target, "state": r.state.name,
                           "app_key": str(r.app_key), "save_fwd": r.save_fwd, "ack2": r.ack2,
                           "attempts": r.attempts, "code": r.code, "created_ms": r.created_ms,
                           "reason": reason(r), "note": r.note, "from_user": r.from_user, "to_user": r.to_user,
                           "channel": r.channel} for r in rows]))
        return 0
    w = max([len(plain(r.state.name)) for r in rows] + [5])
    print(f"{'LK0':<28} {'TO':<10} {'STATE':<{w}} {'SF':>2} {'ACK2':>4} {'TRIES':>5} {'CODE':>4}  {'AGE':>5}  APPKEY")
    for r in rows:
        why = shown(reason(r) or (f"({r.note})" if r.note else ""))
        print(f"{r.lk0!s:<28} {r.target:<10} {plain(r.state.name):<{w}} {r.save_fwd:>2} {int(r.ack2):>4} {r.attempts:>5}"
              f" {r.code:>4}  {format_age(r.created_ms):>5}  {shown(r.app_key)}" + (f"  {why}" if why else ""))
    print(f"{len(rows)} message(s) pending or failed (confirmed ones are cleaned up)", file=sys.stderr)
    return 0


def _cert_status(cfg: Config) -> None:
    from semq.identity.crypto import CryptoError, load_certificate
    from semq.identity.security import NodeSecurity, SecurityError

    try:
        sec = NodeSecurity(cfg.directory)
    except (SecurityError, CryptoError, OSError, ValueError) as e:
        print(f"  security: PROBLEM: {e}")
        return
    days = sec.expires_in_days()
    warn = "  WARNING: renew it (semq node init a new key, enroll, import)" if days < 30 else ""
    print(f"  certificate: serial {sec.identity.certificate.serial:x}, expires in {days:.0f} days{warn}")
    print(f"  fingerprint: {sec.identity.certificate.fingerprint}  (others compare it with what they pinned:"
          f" semq node trust {cfg.org})")
    _ = load_certificate


def cmd_status(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    live = live_status(cfg.unit_dir, timeout=2.0) or daemon_status(cfg)
    if cfg.role == "node":
        return _node_status(args, cfg, live)
    return _platform_status(args, cfg, live)


def _node_status(args: argparse.Namespace, cfg: Config, live: dict[str, Any] | None) -> int:
    """``semq status`` of a node: its daemon (each unit's), its store's
    counts, its certificate."""
    from semq.node.api import NodeClient

    with NodeClient(cfg.directory, config=cfg) as client:
        counts = client.status()
    per_unit = counts.pop("units", None)
    data = {"role": "node", "org": cfg.org, "platform": cfg.platform, "daemon": live, **counts}
    if per_unit is not None:
        # A node of several units: each one's daemon and counts.
        data["units"] = [{"unit": k, "daemon": live_status(u.unit_dir, timeout=2.0) or daemon_status(u), **c}
                         for k, c in enumerate(per_unit, 1) for u in [cfg.for_unit(k)]]
    if args.json:
        print(json.dumps(data))
        return 0

    def connection(live: dict[str, Any] | None) -> str:
        if live is None:
            return "not running"
        if live.get("connected"):
            return f"running, connected to {live.get('platform') or cfg.platform}"
        return f"running, NOT connected to {','.join(live.get('platforms') or [cfg.platform])}"

    if per_unit is None:
        print(f"node {cfg.org} ({cfg.directory})\n  daemon: {connection(live)}")
    else:
        print(f"node {cfg.org} ({cfg.directory}), {cfg.units} units")
        for u in data["units"]:
            st = u["outbox"]
            print(f"  unit {u['unit']}: {connection(u['daemon'])}; pending-send {sum(st.values())},"
                  f" pending-ack {u['pending_ack']}, inbox {u['inbox_unread']} unread")
    if live is not None:
        from semq.ops.cli import direct_lines

        for line in direct_lines(live.get("direct")):
            print(line)
    states = counts["outbox"]
    print("  pending-send: " + counts_shown(states))
    print(f"  pending-ack: {counts['pending_ack']}   inbox: {counts['inbox_unread']} unread"
          f" / {counts['inbox_total']}   dedup: {counts['dedup']}")
    print(f"  oldest unconfirmed: {format_age(counts['oldest_unconfirmed_ms'])}")
    for w in counts.get("channels_waiting") or []:
        print(f"  ordered {shown(w['text'])}, since {format_age(w['since_ms'])} ago")
    if cfg.security:
        _cert_status(cfg)
    else:
        print("  security: OFF")
    return 0


def _platform_status(args: argparse.Namespace, cfg: Config, live: dict[str, Any] | None) -> int:
    """``semq status`` of the platform: its daemon, the nodes it knows, what
    it stores and relays, its instances on a PostgreSQL store."""
    from semq.platform.core import PlatformCore

    pcore = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        counts = pcore.counts()
    finally:
        pcore.close()
    data = {"role": "platform", "id": cfg.platform_id, "daemon": live, **counts}
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"platform {cfg.platform_id} ({cfg.directory})")
    print("  daemon: " + ("not running" if live is None else f"listening on {live.get('listen')}"))
    if live is not None:
        print(f"  online: {', '.join(live.get('online', [])) or 'none'}")
    print(f"  known nodes: {', '.join(counts['known_nodes']) or 'none'}")
    stored = counts["stored"]
    print("  stored for: " + (", ".join(f"{t}={v['stored']} (oldest {format_age(v['oldest_ms'])})"
                                       for t, v in stored.items()) or "nothing"))
    print(f"  relayed acks/inquiries waiting: {counts['relayed_waiting']}")
    kept = counts.get("chunks_kept") or {}
    if kept.get("chunks"):
        print(f"  large documents' chunks kept: {kept['chunks']} ({format_size(kept['bytes'])})")
    for a in counts.get("direct", []):
        state = "" if a["live"] else " (expired)"
        who = f", for {', '.join(a['allowed'])} only" if a["allowed"] else ""
        print(f"  direct links: {a['node']} listens at {', '.join(a['addresses'])}{state}{who}")
    if "instances" in counts:
        print(f"  store: {counts['store']} (PostgreSQL); instances:")
        for i in counts["instances"] or [{"address": "none running", "holds": 0, "alive": False, "pid": "-"}]:
            state = "running" if i["alive"] else "gone (no heartbeat)"
            print(f"    {i['address']:<22} {state}, pid {i['pid']}, holds {i['holds']} organization(s)")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq messages`` and ``semq status``."""
    x = sub.add_parser("messages", parents=[common], help="pending-send rows with state and age")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"at most N rows (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--receipt", metavar="LK0", help="show the signed delivery receipt of a document, verified")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    x.set_defaults(func=cmd_messages)

    x = sub.add_parser("status", parents=[common], help="node or platform status")
    x.add_argument("--json", action="store_true", help="as JSON, for programs")
    x.set_defaults(func=cmd_status)
