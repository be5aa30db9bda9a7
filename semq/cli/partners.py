"""``semq partners``: each organization this node exchanges documents
with — whether the platform last saw it online and since when, the
backlog each way, its oldest waiting document, its certificate's expiry,
the direct link's state. Asked of the running daemon (the admin request
``partners``, semq.ops.partners, which the console and the HTTP API ask
too)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from semq.cli._common import config_of
from semq.ops.display import age, check_count, shown, when

__all__ = ["cmd_partners", "partner_lines", "register"]


def _presence(p: dict[str, Any]) -> str:
    if p.get("protocol"):
        return f"{p['protocol'].upper()} partner (no platform)"
    if p["online"] is None:
        return "not known" if p.get("told_ms") is None else "unknown to the platform"
    word = "online" if p["online"] else "offline"
    return f"{word} since {when(p['since_ms'])[:16]} ({age(p['since_ms'])})" if p.get("since_ms") else f"{word}"


def _expiry(ms: int | None) -> str:
    if ms is None:
        return "-"
    left = age(ms)
    return f"{when(ms)[:10]} ({left})" if left.startswith("in ") else f"{when(ms)[:10]} (expired)"


def partner_lines(res: dict[str, Any]) -> list[str]:
    """The table a person reads (also the console's plain-text view)."""
    head = ("PARTNER", "PLATFORM SAYS", "LAST SEEN", "OUT", "IN", "OLDEST", "CERT EXPIRES", "LINK")
    body = [(shown(p["org"]), _presence(p), when(p["last_seen_ms"])[:16] if p.get("last_seen_ms") else "-",
             str(p["backlog_out"]), str(p["backlog_in"]),
             age(p["oldest_waiting_ms"]) if p.get("oldest_waiting_ms") else "-", _expiry(p.get("cert_expires_ms")),
             p["link"] + (f" ({shown(p['link_detail'])})" if p.get("link_detail") else ""))
            for p in res["partners"]]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]


def cmd_partners(args: argparse.Namespace) -> int:
    from semq.ops.admin import AdminError
    from semq.ops.partners import ask_partners

    timeout = check_count(args.timeout, "--timeout", 0.1, 3600.0)
    cfg = config_of(args, "node")
    try:
        res = ask_partners(cfg, timeout=timeout)
    except AdminError as e:
        print(f"error: the node's daemon does not answer ({e}); semq partners asks the running daemon:"
              " start it with 'semq node run'", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res))
        return 0
    if not res["partners"]:
        print("no partners yet: no documents sent or received, no certificate pinned, no direct link")
        return 0
    print("\n".join(partner_lines(res)))
    told = [p["told_ms"] for p in res["partners"] if p.get("told_ms")]
    if not res.get("connected"):
        print("note: the platform is unreachable now: online/offline is what it said"
              + (f" {age(min(told))} ago" if told else " (it has not been asked yet)"), file=sys.stderr)
    if res.get("more"):
        print(f"({res['more']} more partners not shown)", file=sys.stderr)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    x = sub.add_parser(
        "partners", parents=[common],
        help="each partner: online or offline (as the platform says), backlog each way, certificate, link",
        description="The organizations this node exchanges documents with (documents in the outbox or the"
                    " inbox, a pinned certificate, a direct link), each with what the platform last said of it"
                    " (online or offline, since when, last seen), the documents waiting to reach it (OUT) and"
                    " those from it no application acknowledged yet (IN), the age of its oldest waiting"
                    " document, when its certificate expires and the direct link's state. Asks the running"
                    " daemon, which asks the platform (at most every 2 s).")
    x.add_argument("--json", action="store_true", help="the daemon's answer as JSON (docs/cli.md)")
    x.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for the daemon")
    x.set_defaults(func=cmd_partners)
