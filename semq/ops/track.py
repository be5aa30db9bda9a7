"""``semq track``: where a document is, and when it got there, from the
delivery history (semq.tracking.history) — long after the store cleaned its rows,
with or without the daemon running."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from semq.tracking.history import HistoryReader, history_paths

from .display import MAX_LIMIT, plain, shown, when
from .why import why_line

__all__ = ["add_track_parser", "cmd_track", "parse_when"]

_DIRECTION = {"origin": "out", "receiver": "in", "platform": "relay"}
_ROLE = {"out": "origin", "in": "receiver", "relay": "platform", "origin": "origin", "receiver": "receiver",
         "platform": "platform"}
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_AGO_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FINAL = frozenset({"ack2", "nack", "expired", "dead", "inbox", "ack2_sent", "refused", "acked", "dropped",
                    "forwarded"})


def parse_when(text: str, now: float | None = None) -> int:
    """``2h`` / ``30m`` / ``7d`` ago, or a date/time (``2026-12-05``,
    ``2026-12-05T10:00``; local time unless it names a zone) -> epoch ms."""
    m = _AGO.match(text)
    now = time.time() if now is None else now
    if m:
        return int((now - float(m.group(1)) * _AGO_UNIT[m.group(2)]) * 1000)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a time ago (90s, 30m, 2h, 7d) nor a date/time (2026-12-05T10:00)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000)


def _time(ms: int | None, *, millis: bool = False) -> str:
    return when(ms) if millis else when(ms)[:19]


def _took(ms: int) -> str:
    s = ms / 1000
    if s < 10:
        return f"{s:.2f}s"
    if s < 600:
        return f"{s:.0f}s"
    if s < 36000:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def _shown(text: Any) -> str:
    """A value from another organization, safe on a terminal; ``-`` for none."""
    return "-" if text is None or text == "" else shown(text)


def _key(row: dict[str, Any]) -> str:
    return _shown(row.get("key")) if row.get("key") is not None else ("(sealed)" if row["role"] == "platform" else "-")


def _table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("FIRST SEEN", "DIR", "LK0", "WITH", "KEY", "SIZE", "PATH", "STATE", "TOOK", "RESENDS", "CODE")
    body = [(_time(r["first_ms"]), _DIRECTION.get(r["role"], r["role"]), r["lk0"], _shown(r["counterpart"]),
             _key(r), _size(r["size"]), r["path"] or "-", plain(r["state"], "step"),
             _took(r["last_ms"] - r["first_ms"]) if r["state"] in _FINAL else "-",
             str(r["resends"]), str(r["code"]) if r["code"] is not None else "-") for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]


def _timeline(row: dict[str, Any]) -> list[str]:
    d = _DIRECTION.get(row["role"], row["role"])
    other = {"out": f"to {row['target']}", "in": f"from {row['source']}",
             "relay": f"{row['source']} to {row['target']}"}.get(d, "")
    key = " / ".join(_shown(row.get(k)) for k in ("domain", "data_type", "subtype", "key") if row.get(k))
    lines = [f"{row['lk0']}  {d} {other}" + (f"  key {key}" if key else "") + f"  {_size(row['size'])}"]
    users = [f"{w} {_shown(row[k])}" for w, k in (("from user", "from_user"), ("to user", "to_user"),
                                                     ("channel", "channel")) if row.get(k)]
    if users:
        lines.append("  " + ", ".join(users))
    for s in row["steps"]:
        extra = [f"path {s['path']}" if s.get("path") else "", f"attempt {s['attempt']}" if (s.get("attempt") or 1) > 1
                 else "", f"code {s['code']}" if s.get("code") is not None else "",
                 f"copy {s['lk1']}" if s.get("lk1") else "", _shown(s["detail"]) if s.get("detail") else ""]
        lines.append(f"  {_time(s['ts'], millis=True)}  {plain(s['event'], 'step'):<36} {'  '.join(e for e in extra if e)}"
                     .rstrip())
    check = row.get("receipt_check")
    if check is not None:
        if check.get("edge"):
            lines.append(f"  {check['protocol'].upper()} receipt kept as proof ({check['size']} bytes): verified with"
                         f" {check['signer']}'s certificate, names message {check['message_id']} and digest"
                         f" {check['digest']}")
        elif check.get("verified"):
            lines.append(f"  receipt verified: signed by {check['signer']} at {_time(check['signed_ms'], millis=True)}"
                         f" over the document digest {check['digest'][:16]}…")
        else:
            lines.append(f"  receipt does NOT verify: {_shown(check.get('error'))}")
    if row["nsteps"] > len(row["steps"]):
        lines.append(f"  ({row['nsteps'] - len(row['steps'])} later steps not kept)")
    return lines


def receipt_check(directory: Path, row: dict[str, Any]) -> dict[str, Any] | None:
    """The receiver's signed receipt of one of a node's confirmed documents,
    verified now against its certificate (what ``semq messages --receipt``
    shows); None when there is none (not confirmed, sent without security,
    not a node, or kept longer than receipts are)."""
    if row["role"] != "origin" or row["state"] != "ack2":
        return None
    if _edge_row(row):
        return edge_receipt(directory, row)
    from semq.node.api import NodeClient
    from semq.settings.config import ConfigError, load_config
    from semq.umxt_protocol import LK0

    try:
        cfg = load_config(directory)
        if cfg.role != "node":
            return None
        lk0 = LK0.parse(row["lk0"])
        with NodeClient(directory, config=cfg) as node:
            info: dict[str, Any] = node.receipt(lk0.record_id, lk0.semq_id)
    except (KeyError, ValueError, ConfigError, OSError):
        return None
    row["receipt"] = info.get("digest")
    return info


def _edge_row(row: dict[str, Any]) -> bool:
    """A document to or from an AS2 / AS4 partner (semq.edge): its key is no LK0."""
    return any(str(row.get(k) or "").startswith(("as2:", "as4:")) for k in ("target", "source"))


def edge_receipt(directory: Path, row: dict[str, Any]) -> dict[str, Any] | None:
    """The partner's receipt (AS2 MDN, AS4 receipt) kept as the proof of one
    of our edge documents: it verified, and named our digest, when it came
    (semq.edge.daemon.sender)."""
    from semq.edge.store import EdgeStore
    from semq.node.api import NodeClient
    from semq.settings.config import ConfigError, load_config

    try:
        cfg = load_config(directory)
        if cfg.role != "node":
            return None
        with NodeClient(directory, config=cfg) as node:
            store = EdgeStore(node.core)
            doc = store.find(row["lk0"])
            proof = store.proof(doc.id) if doc is not None else None
    except (KeyError, ValueError, ConfigError, OSError):
        return None
    if doc is None or proof is None:
        return None
    return {"edge": True, "verified": True, "protocol": doc.protocol, "message_id": doc.message_id,
            "digest": doc.digest, "size": len(proof), "signer": doc.address, "signed_ms": doc.updated_ms}


def why_now(directory: Path, row: dict[str, Any]) -> dict[str, Any] | bool | None:
    """Where one of a node's documents is now and why it waits (semq.ops.why),
    asked of the running daemon; None when nothing waits (confirmed, or
    delivered to an application here); False at the platform, or for a
    data directory that is not a node's."""
    from semq.settings.config import ConfigError, load_config

    from .partners import ask_why

    if row["role"] not in ("origin", "receiver") or _edge_row(row):
        return False
    if row["state"] in ("ack2", "inbox"):
        return None
    try:
        cfg = load_config(directory)
    except (ConfigError, OSError):
        return False
    if cfg.role != "node":
        return False
    got = ask_why(cfg, row["lk0"], ours=row["role"] == "origin")
    return got["why"] if got.get("found") else None


def _days(directory: Path) -> int:
    from semq.settings.config import ConfigError, load_config

    try:
        return int(load_config(directory).history_days)
    except (ConfigError, OSError):
        return 0


def cmd_track(args: argparse.Namespace) -> int:
    from semq.settings.config import data_dir

    directory: Path = data_dir(getattr(args, "dir", None))
    paths = history_paths(directory)
    if not paths:
        print(f"error: no delivery history in {directory} yet (the daemon writes it as documents move;"
              " history_days = 0 turns it off)", file=sys.stderr)
        return 1
    if not 1 <= args.limit <= MAX_LIMIT:
        print(f"error: --limit {args.limit} is outside 1..{MAX_LIMIT}", file=sys.stderr)
        return 2
    reader = HistoryReader(paths)
    try:
        rows = reader.search(text=args.query, target=args.to, source=getattr(args, "from"),
                             role=_ROLE[args.direction] if args.direction else None, state=args.state,
                             since_ms=args.since, until_ms=args.until, limit=args.limit)
        lk0s = {r["lk0"] for r in rows}
        detail = [d for lk0 in sorted(lk0s) for d in reader.document(lk0)] if len(lk0s) == 1 else []
        behind = reader.behind(directory / "events", _days(directory))
    finally:
        reader.close()
    if behind:
        # Indexed at idle priority: under load it falls behind, and says so.
        print(f"note: the history has {_size(behind)} of events still to index (it catches up when the machine"
              " has CPU to spare); the newest steps may be missing", file=sys.stderr)
    for d in detail:
        check = receipt_check(directory, d)
        if check is not None:
            d["receipt_check"] = check
        w = why_now(directory, d)
        if w is not False:
            d["why"] = w
    if args.json:
        print(json.dumps(detail or rows, default=str))
        return 0 if rows else 1
    if not rows:
        print("no document in the history matches", file=sys.stderr)
        return 1
    if detail:
        for i, d in enumerate(detail):
            if i:
                print()
            print("\n".join(_timeline(d)))
            if "why" in d:
                print(why_line(d["why"]))
        return 0
    print("\n".join(_table(rows)))
    if len(rows) == args.limit:
        print(f"(the newest {args.limit}; --limit N for more)", file=sys.stderr)
    return 0


def add_track_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    x = sub.add_parser(
        "track", parents=[common], help="where a document is and when it got there (the delivery history)",
        description="Answers from the delivery history the daemon keeps (history_days, default 90), also"
                    " after the store has cleaned a confirmed document. One document: its timeline, every"
                    " step with its time, and one last line: where it is now, why it waits and what to do"
                    " (asked of the running daemon); several: a table, newest first.",
        epilog="examples:\n  semq track INV-0042\n  semq track 10008/1/1/42\n"
               "  semq track --to 56001 --since 2h\n  semq track --state nack --since 1d --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("query", nargs="?", help="an LK0 (ORG/UNIT/DB/RECORD), or an AppKey key (or its beginning)")
    x.add_argument("--to", metavar="ORG", help="documents to this organization (and, at the platform, relayed to it)")
    x.add_argument("--from", metavar="ORG", help="documents from this organization")
    x.add_argument("--direction", choices=["out", "in", "relay"],
                   help="out: sent by this node; in: received; relay: the platform's view")
    x.add_argument("--state", metavar="S",
                   help="the document's last step, e.g. ack2 (confirmed), nack, sent, inbox, stored")
    x.add_argument("--since", type=parse_when, metavar="WHEN", help="first seen after: 30m, 2h, 7d ago or a date/time")
    x.add_argument("--until", type=parse_when, metavar="WHEN", help="first seen before: as --since")
    x.add_argument("--limit", type=int, default=50, metavar="N", help="at most N documents, newest first (default 50)")
    x.add_argument("--json", action="store_true", help="JSON: the rows with their steps (one document: and its why)")
    x.set_defaults(func=cmd_track)
