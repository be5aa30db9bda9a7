"""Operational subcommands of ``semq``: ``admin``, ``service``, ``backup``,
``restore``. ``register(subparsers)`` adds them to the main parser;
``main(argv)`` runs them alone (``python -m semq.ops``), with the same
conventions: 0 ok, 1 a runtime failure (no daemon, a failed backup), 2 a
user's mistake; errors are one line on stderr.

Importing this module is cheap: each command imports what it needs.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .display import MAX_LIMIT, age, check_count, counts_shown, is_time_key, plain, shown, when
from .why import why_line

__all__ = ["OpsUsageError", "main", "parse_duration", "register"]


class OpsUsageError(ValueError):
    """The user's mistake (exit status 2 in semq.cli.main)."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``2d``, ``500ms`` or bare seconds -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 90s, 15m, 1h, 2d)")
    return float(m.group(1)) * _UNIT[m.group(2) or "s"]


def _cli_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One line on stderr and the exit status for the errors of these
    commands, whatever ``main`` runs them (tracebacks with --verbose)."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from .admin import AdminCommandFailed, AdminError
        from .backup import BackupError, BackupRefused, RestoreRefused

        try:
            return func(args)
        except (AdminCommandFailed, BackupRefused, RestoreRefused, OpsUsageError) as e:
            if getattr(args, "verbose", False):
                raise
            print(f"error: {e}", file=sys.stderr)
            return 2
        except (AdminError, BackupError) as e:
            if getattr(args, "verbose", False):
                raise
            print(f"error: {e}", file=sys.stderr)
            return 1

    return run


def _dir(args: argparse.Namespace) -> Path:
    from semq.settings.config import data_dir

    return data_dir(getattr(args, "dir", None))


def _age(ms: int | None) -> str:
    return age(ms)


def _field(key: str, value: Any) -> str:
    """One field of an answer for a person: epoch milliseconds as a time,
    text with its control characters escaped."""
    if is_time_key(key) and isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        ago = age(value)
        return f"{when(value)} ({ago if ago.startswith('in ') else ago + ' ago'})"
    return shown(value)


def _print_fields(d: dict[str, Any], indent: str = "") -> None:
    for k, v in d.items():
        if isinstance(v, dict):
            print(f"{indent}{k}:")
            _print_fields(v, indent + "  ")
        elif isinstance(v, list):
            print(f"{indent}{k}: {shown(json.dumps(v))}")
        else:
            print(f"{indent}{k}: {_field(k, v)}")


def _size(n: int) -> str:
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if f < 1024 or unit == "GiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return f"{n} B"


# ---------------------------------------------------------------- admin


def _call(args: argparse.Namespace, cmd: str, payload: dict[str, Any] | None = None) -> Any:
    """The daemon's answer to ``cmd``. A node of several units (semq.umxt_protocol.units)
    answers as one: each unit is asked (``--unit K``: that one only) and
    the answers are merged (``_merge``)."""
    from semq.settings.config import load_config

    from .admin import AdminError, admin_call, admin_socket_path

    d = _dir(args)
    cfg = load_config(d)  # a wrong --dir is the user's mistake: say so before "no daemon"
    unit = getattr(args, "unit", None)
    if unit is not None:
        return admin_call(admin_socket_path(cfg.for_unit(unit).unit_dir), cmd, payload or {}, timeout=args.timeout)
    if cfg.units == 1:
        return admin_call(admin_socket_path(d), cmd, payload or {}, timeout=args.timeout)
    answers: list[tuple[int, Any]] = []
    failed: list[tuple[int, Exception]] = []
    for k in range(1, cfg.units + 1):
        try:
            answers.append((k, admin_call(admin_socket_path(cfg.for_unit(k).unit_dir), cmd, payload or {},
                                          timeout=args.timeout)))
        except AdminError as e:
            failed.append((k, e))
    if not answers or (failed and cmd not in ("show",)):
        bad_unit, err = failed[0]
        raise type(err)(f"unit {bad_unit} of {cfg.units}: {err}") from err
    return _merge(cmd, answers)


def _merge(cmd: str, answers: list[tuple[int, Any]]) -> Any:
    """Several units' answers to ``cmd`` as one node's: rows side by side
    (each with its ``unit``), counts added up, a record from the unit that
    has it; otherwise ``{"units": [{"unit": K, ...}]}``."""
    first = answers[0][1]
    if cmd in ("list", "stuck") and isinstance(first, dict):
        merged = dict(first)
        merged["rows"] = [{**r, "unit": k} for k, a in answers for r in a.get("rows", [])]
        merged["count"] = sum(a.get("count", 0) for _, a in answers)
        if any(a.get("channels") for _, a in answers):
            merged["channels"] = [{**c, "unit": k} for k, a in answers for c in a.get("channels") or []]
        for key in ("by_place", "by_place_listed"):
            if any(a.get(key) for _, a in answers):
                places: dict[str, int] = {}
                for _, a in answers:
                    for place, n in (a.get(key) or {}).items():
                        places[place] = places.get(place, 0) + n
                merged[key] = places
        return merged
    if cmd in ("requeue", "resend", "purge") and isinstance(first, dict):
        merged = dict(first)
        for key in ("matched", "changed", "would"):
            if key in first:
                merged[key] = sum(a.get(key, 0) for _, a in answers)
        merged["skipped"] = [{**x, "unit": k} for k, a in answers for x in a.get("skipped") or []]
        merged["more"] = any(a.get("more") for _, a in answers)
        return merged
    if cmd == "show":
        return {**first, "unit": answers[0][0]}
    if cmd in ("drain", "stop", "reload", "ping") and isinstance(first, dict):
        return {**first, "units": [{"unit": k, **a} for k, a in answers]}
    return {"units": [{"unit": k, **(a if isinstance(a, dict) else {"result": a})} for k, a in answers]}


def direct_lines(d: dict[str, Any] | None) -> list[str]:
    """The direct links of a node's status (``semq status``, ``semq admin
    status``): its policy and listener, each link, and each organization
    whose documents go through the platform for want of one."""
    if not d:
        return []
    listening = f"; listening on {d['listening']}" if d.get("listening") else "; not listening"
    out = [f"  direct links: policy {d.get('policy')}{listening}"]
    for link in d.get("links", []):
        since = _age(link.get("since_ms"))
        if link.get("direction") == "out":
            out.append(f"    to   {link['peer']:<10} {link['address']:<22} {link['state']} for {since},"
                       f" sent {link.get('sent', 0)}, in flight {link.get('in_flight', 0)}")
        else:
            out.append(f"    from {link['peer']:<10} {link['address']:<22} {link['state']} for {since},"
                       f" received {link.get('received', 0)}")
    for org, w in sorted((d.get("waiting") or {}).items()):
        out.append(f"    to   {org:<10} no link: {w.get('why')} (tried again in {w.get('retry_in_s')} s)")
    return out


def _print_status(r: dict[str, Any]) -> None:
    drain = r.get("drain") or {}
    draining = "  DRAINING" if drain.get("requested") else ""
    if r.get("role") == "node":
        conn = (f"connected to the platform at {r['platform']}" if r.get("connected") and r.get("platform")
                else "connected to the platform" if r.get("connected") else "NOT connected to the platform")
        print(f"node {r['org']} (pid {r['pid']}): {conn}, sessions {r['sessions']},"
              f" in flight {r['in_flight']}{draining}")
        for i in r.get("instances", []):
            state = "this instance" if i.get("this") else ("running" if i.get("alive") else "gone (no heartbeat)")
            print(f"  instance {i['address']:<22} {state}, holds {i['holds']} organization(s)")
        for line in direct_lines(r.get("direct")):
            print(line)
        st = r.get("stats", {})
        print("  counters: " + (" ".join(f"{k}={v}" for k, v in st.items()) or "-"))
        print("  pending-send: " + counts_shown(r.get("outbox", {})))
        print(f"  pending-ack: {r.get('pending_ack', 0)}   inbox: {r.get('inbox_unread', 0)} unread"
              f" / {r.get('inbox_total', 0)}")
        print(f"  oldest unconfirmed: {_age(r.get('oldest_unconfirmed_ms'))}")
        if r.get("queues"):
            print(f"  {'TARGET':<12} {'COUNT':>8}  {'OLDEST':<6}  STATE")
            for q in r["queues"]:
                print(f"  {q['target']:<12} {q['count']:>8}  {_age(q['oldest_ms']):<6}  {plain(q['state'])}")
    else:
        print(f"platform {r['id']} (pid {r['pid']}, port {r.get('port')}): {r['connections']} connected{draining}")
        for o in r.get("sessions", []):
            print(f"  online  {o['node']:<12} queued {_size(o['queued_bytes'])}, in flight"
                  f" {o['in_flight']}/{o['window']}")
        for n in r.get("nodes", []):
            if not n.get("online"):
                rev = " (revoked)" if n.get("revoked") else ""
                print(f"  offline {n['node']:<12} last connected {_age(n.get('last_seen_ms'))} ago{rev}")
        for i in r.get("instances", []):
            state = "this instance" if i.get("this") else ("running" if i.get("alive") else "gone (no heartbeat)")
            print(f"  instance {i['address']:<22} {state}, holds {i['holds']} organization(s)")
        for a in r.get("direct", []):
            state = "" if a.get("live") else " (expired)"
            who = f", for {', '.join(a['allowed'])} only" if a.get("allowed") else ""
            print(f"  direct   {a['node']:<12} listens at {', '.join(a['addresses'])}{state}{who}")
        st = r.get("stats", {})
        print("  counters: " + (" ".join(f"{k}={v}" for k, v in st.items()) or "-"))
        print(f"  relayed acks/inquiries waiting: {r.get('relayed_waiting', 0)};"
              f" oldest stored: {_age(r.get('oldest_unconfirmed_ms'))}")
        if r.get("queues"):
            print(f"  {'TARGET':<12} {'KIND':<8} {'COUNT':>8}  {'OLDEST':<6}  STATE")
            for q in r["queues"]:
                print(f"  {q['target']:<12} {q['kind']:<8} {q['count']:>8}  {_age(q['oldest_ms']):<6}"
                      f"  {plain(q['state'], 'platform')}")
    b = r.get("commit_batches")
    extra = (f"; commit batches: {b['transactions']} (mean {b['mean_size']}, max {b['max_size']},"
             f" {b['mean_ms']} ms)") if b else ""
    print(f"  store: {_size(r.get('store_bytes', 0))}, {r.get('store_calls', 0)} store calls{extra}")
    if drain.get("requested"):
        print(f"  drain: {shown(drain.get('reason'))} ({_age(drain.get('since_ms'))} ago)")


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    if "save_fwd" in rows[0]:  # node outbox
        # Record ids start at the store's creation time in microseconds:
        # 16 digits (docs/exactly-once.md).
        w = max(len(plain(r["state"])) for r in rows)
        print(f"{'ID':>16}  {'TO':<10} {'STATE':<{w}} {'SF':>2} {'TRIES':>5} {'CODE':>4} {'SIZE':>8} {'AGE':>6}"
              "  PLACE/APPKEY")
        for r in rows:
            k = r.get("app_key", {})
            extra = shown(r.get("reason") or r.get("place") or "/".join(
                x for x in (k.get("domain"), k.get("data_type"), k.get("subtype"), k.get("key")) if x))
            print(f"{r['id']:>16}  {r['target']:<10} {plain(r['state']):<{w}} {r['save_fwd']:>2} {r['attempts']:>5}"
                  f" {r['code']:>4} {r['size']:>8} {_age(r['created_ms']):>6}  {extra}")
    elif "p_ack" in rows[0] or "s_ack" in rows[0]:  # node inbound
        w = max(len(plain(r[k], "ack")) for r in rows for k in ("p_ack", "s_ack"))
        print(f"{'ID':>16}  {'LK0':<28} {'PLATFORM ACK':<{w}} {'SENDER ACK':<{w}} {'ASKED':>5} {'AGE':>6}  PLACE")
        for r in rows:
            print(f"{r['id']:>16}  {r['lk0']:<28} {plain(r['p_ack'], 'ack'):<{w}} {plain(r['s_ack'], 'ack'):<{w}}"
                  f" {r['inquiries']:>5} {_age(r['received_ms']):>6}  {shown(r.get('place', ''))}")
    else:  # platform stored
        w = max(len(plain(r["state"], "platform")) for r in rows)
        print(f"{'ID':>8}  {'TO':<10} {'KIND':<12} {'LK0':<28} {'STATE':<{w}} {'TRIES':>5} {'SIZE':>8} {'AGE':>6}"
              "  PLACE")
        for r in rows:
            place = shown(r.get("place") or ("online" if r.get("target_online") else "offline"))
            print(f"{r['id']:>8}  {r['target']:<10} {r['kind']:<12} {r['lk0'] or '-':<28}"
                  f" {plain(r['state'], 'platform'):<{w}}"
                  f" {r['attempts']:>5} {r['size']:>8} {_age(r['stored_ms']):>6}  {place}")


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if getattr(args, "ids", None):
        sel["ids"] = [_record_id(i) for i in args.ids]
    if getattr(args, "state", None):
        sel["state"] = args.state
    if getattr(args, "target", None):
        sel["target"] = args.target
    if getattr(args, "older_than", None) is not None:
        sel["older_than"] = args.older_than
    if getattr(args, "all", False):
        sel["all"] = True
    if getattr(args, "dry_run", False):
        sel["dry_run"] = True
    if getattr(args, "kind", None):
        sel["kind"] = args.kind
    return sel


def _record_id(text: str) -> int:
    t = text.strip()
    if "/" in t:  # an LK0 of ours: its record id
        t = t.rsplit("/", 1)[1]
    if not t.isdigit() or int(t) <= 0:
        raise OpsUsageError(f"{text!r} is not a record id or an LK0")
    return int(t)


def _none_found(args: argparse.Namespace, cmd: str) -> int:
    """``admin requeue|resend|purge ID...`` that found none of them: one
    line each, saying what became of it (confirmed end to end, by whom and
    when, and how to send a new copy), exit 2."""
    from semq.settings.config import load_config

    from .confirmed import confirmations

    cfg = load_config(_dir(args))
    done = confirmations(cfg.directory, cfg, list(args.ids)) if cfg.role == "node" else {}
    for ref in args.ids:
        if ref in done:
            lk0, by, at = done[ref]
            again = (f"; to send a new copy, send its content again as a new document (semq send --to {by} ...)"
                     if cmd != "purge" else "")
            print(f"error: {lk0} is already confirmed by {by} (at {when(at)[:19]}); nothing to {cmd}{again}",
                  file=sys.stderr)
        else:
            print(f"error: {ref}: no such document here to {cmd} (not sent from here, or confirmed and cleaned"
                  " up longer ago than the delivery history keeps)", file=sys.stderr)
    return 2


def _wait_gone(args: argparse.Namespace) -> None:
    """Until the daemon's admin socket stops answering (bounded by --timeout)."""
    from semq.settings.config import load_config

    from .admin import AdminError, admin_request, admin_socket_path

    cfg = load_config(_dir(args))
    units = [args.unit] if getattr(args, "unit", None) else range(1, cfg.units + 1)
    socks = [admin_socket_path(cfg.for_unit(k).unit_dir) for k in units]
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        answering = []
        for sock in socks:
            try:
                admin_request(sock, "ping", timeout=min(2.0, args.timeout))
                answering.append(sock)
            except AdminError:
                pass
        if not answering:
            return
        socks = answering
        time.sleep(0.1)
    raise AdminError(f"the daemon still answers after {args.wait:g} s")


def _print_hidden(result: dict[str, Any], limit: int) -> None:
    """What ``admin stuck`` does not show, and how to see it."""
    younger = int(result.get("younger") or 0)
    if younger:
        print(f"{younger} not confirmed yet but younger than {_duration(result['older_than_s'])} not shown"
              " (--older-than 0 shows them all, e.g. --older-than 5m those older than 5 minutes)")
    if len(result.get("rows") or []) >= limit and result.get("count", 0) > limit:
        print(f"only the oldest {limit} of {result['count']} listed (--limit N lists more)")


def _duration(s: float) -> str:
    return f"{s / 3600:g} h" if s >= 3600 else f"{s / 60:g} min" if s >= 60 else f"{s:g} s"


@_cli_errors
def cmd_admin(args: argparse.Namespace) -> int:
    cmd = args.admin_cmd
    payload: dict[str, Any] = {}
    check_count(args.timeout, "--timeout", 0.1, 3600.0)
    if cmd in ("list", "stuck"):
        check_count(args.limit, "--limit", 1, MAX_LIMIT)
    if cmd == "list" and args.after is not None:
        check_count(args.after, "--after", 0, 2**63 - 1)
    if cmd in ("drain", "stop"):
        check_count(args.wait, "--wait", 0, 86400.0)
    if cmd == "list":
        payload = {k: v for k, v in {"state": args.state, "target": args.target, "older_than": args.older_than,
                                     "limit": args.limit, "after": args.after, "table": args.table,
                                     "kind": args.kind, "origin": args.origin}.items() if v is not None}
    elif cmd == "show":
        t = args.record
        payload = {"lk0": t} if "/" in t else {"id": _record_id(t)}
        if args.table:
            payload["table"] = args.table
    elif cmd == "stuck":
        payload = {"limit": args.limit}
        if args.older_than is not None:
            payload["older_than"] = args.older_than
    elif cmd in ("requeue", "resend", "purge"):
        payload = _selection(args)
        if not payload.get("ids") and not any(k in payload for k in ("state", "target", "older_than", "all")):
            raise OpsUsageError(f"admin {cmd} needs record ids, or --state/--target/--older-than, or --all")
    elif cmd in ("drain", "stop") and args.reason:
        payload = {"reason": args.reason}
    result = _call(args, cmd, payload)
    if cmd in ("drain", "stop") and args.wait:
        _wait_gone(args)
    if args.json:
        print(json.dumps(result))
        return 0
    if cmd == "status" and "units" in result:
        for u in result["units"]:
            print(f"unit {u['unit']}:")
            _print_status(u)
    elif cmd == "status":
        _print_status(result)
    elif cmd in ("list", "stuck"):
        if cmd == "stuck":
            places = ", ".join(f"{k}={v}" for k, v in (result.get("by_place") or result.get("by_place_listed")
                                                          or {}).items())
            print(f"{result['count']} stuck (no end-to-end confirmation for {result['older_than_s']:g} s)"
                  + (f": {places}" if places else ""))
            for c in result.get("channels") or []:
                print(f"ordered {shown(c['text'])}")
        _print_rows(result["rows"])
        if cmd == "stuck":
            _print_hidden(result, args.limit)
        if cmd == "list":
            print(f"{result['count']} row(s)", file=sys.stderr)
    elif cmd == "show":
        w = result.pop("why", False)
        _print_fields(result)
        if w is not False:
            print(why_line(w))
    elif cmd in ("requeue", "resend", "purge"):
        verb = {"requeue": "requeued", "resend": "resent", "purge": "purged"}[cmd]
        if args.ids and not result.get("matched"):
            return _none_found(args, cmd)
        if result.get("dry_run"):
            print(f"dry run: would have {verb} {result['would']} of {result['matched']} matched")
        else:
            print(f"{verb} {result['changed']} of {result['matched']} matched")
        if result.get("skipped"):
            print(f"skipped {len(result['skipped'])} (state does not allow it): "
                  + ", ".join(f"{s['id']}:{s['state']}" for s in result["skipped"][:20]))
        if result.get("more"):
            print("more rows match: run it again")
    elif cmd == "drain":
        print("draining: no new work; the daemon stops when in-flight work is done"
              f" (at most {result.get('timeout_s', 0):g} s)" + (" — stopped" if args.wait else ""))
    elif cmd == "stop":
        print("stopping" + (" — stopped" if args.wait else ""))
    elif cmd == "reload":
        changed = result.get("changed")
        print("reloaded: " + (json.dumps(changed) if changed else "nothing changed"))
    else:
        print(json.dumps(result))
    return 0


@_cli_errors
def cmd_grafana_dashboard(args: argparse.Namespace) -> int:
    from .metrics import grafana_dashboard

    text = grafana_dashboard()
    if args.output:
        Path(args.output).write_text(text, "utf-8")
        print(f"Grafana dashboard written to {args.output} (Grafana: Dashboards > New > Import)",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------- service, backup, restore


@_cli_errors
def cmd_service_install(args: argparse.Namespace) -> int:
    """Write the unit; never over a different one without --force, never
    for a data directory the unit could not use (semq.ops.service)."""
    from semq.settings.config import Config, ConfigError, load_config

    from .service import DEFAULT_UNIT_DIR, UnitRefused, UnitSpec, check_data_dir, install_unit

    d = _dir(args)
    ident = ""
    cfg: Config | None
    try:
        cfg = load_config(d)
    except ConfigError:
        cfg = None  # --print shows the unit anyway; an install is refused by check_data_dir, with the reason
    if cfg is not None:
        if cfg.role != args.role:
            raise OpsUsageError(f"{d} holds a {cfg.role}, not a {args.role}")
        ident = cfg.org if cfg.role == "node" else cfg.platform_id
    extra = ("--metrics", args.metrics) if args.metrics else ()
    spec = UnitSpec(role=args.role, directory=d, user=args.user, group=args.group, ident=ident, extra_args=extra)
    try:
        if not args.print:
            check_data_dir(spec)
        install_unit(spec, Path(args.unit_dir) if args.unit_dir else DEFAULT_UNIT_DIR, print_only=args.print,
                     force=args.force)
    except UnitRefused as e:
        raise OpsUsageError(str(e)) from None
    return 0


@_cli_errors
def cmd_backup(args: argparse.Namespace) -> int:
    from .backup import backup

    info = backup(_dir(args), Path(args.out), include_keys=args.include_keys)
    rows = ", ".join(f"{k}={v}" for k, v in info.tables.items() if k != "meta")
    print(f"backup of the {info.role} store written to {info.path} ({_size(info.bytes)}; {rows})")
    if info.include_keys:
        print("WARNING: the backup holds private keys: keep it encrypted or offline (it is 0600 here)",
              file=sys.stderr)
    elif len(info.files) > 1:
        print("note: private keys are not included (--include-keys); back them up separately", file=sys.stderr)
    return 0


@_cli_errors
def cmd_restore(args: argparse.Namespace) -> int:
    from .backup import restore

    info = restore(Path(args.file), _dir(args), force=args.force)
    print(f"restored the {info.role} store into {info.directory} ({len(info.files)} files)")
    if info.id_floor:
        print(f"  new record ids start above {info.id_floor} (the restore time), never reusing one sent"
              " since the backup")
    for r in info.replaced:
        print(f"  kept the replaced {r}")
    for w in info.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


@_cli_errors
def cmd_compact(args: argparse.Namespace) -> int:
    from semq.settings.config import load_config

    from .backup import compact

    d = _dir(args)
    load_config(d)  # a wrong --dir or semq.toml: one line, before the note below
    print(f"compacting the store in {d} (a checked copy is rewritten; about as long as copying the file) ...",
          file=sys.stderr, flush=True)
    info = compact(d)
    print(f"compacted the {info.role} store {info.store}: page size {info.page_size[0]:,} -> {info.page_size[1]:,}"
          f" bytes, {_size(info.bytes[0])} -> {_size(info.bytes[1])}; the store as it was is kept as {info.kept}")
    return 0


# ---------------------------------------------------------------- parser


def _common() -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    return c


def register(sub: Any) -> None:
    """Add ``track``, ``admin``, ``service``, ``backup``, ``compact`` and ``restore`` to the
    subparsers ``sub`` of the ``semq`` parser."""
    common = _common()
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    out.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for the daemon")
    out.add_argument("--unit", type=int, metavar="K",
                     help="a node of several units: ask unit K only (default: every unit, answered as one)")
    sel = argparse.ArgumentParser(add_help=False)
    sel.add_argument("ids", nargs="*", help="record ids (or LK0s)")
    sel.add_argument("--state", help="e.g. SS_FAILED, SS_SENT (comma-separated)")
    sel.add_argument("--target", help="target organization")
    sel.add_argument("--older-than", type=parse_duration, metavar="DURATION", help="e.g. 30m, 2h, 1d")
    sel.add_argument("--all", action="store_true", help="every row the state allows (no filter)")
    sel.add_argument("--dry-run", action="store_true", help="only count what would change")

    from .track import add_track_parser

    add_track_parser(sub, common)

    adm = sub.add_parser("admin", help="talk to the running daemon (admin socket); its Grafana dashboard"
                         ).add_subparsers(
        dest="admin_cmd", required=True)
    x = adm.add_parser("status", parents=[common, out], help="connections, queues per target and state, counters")
    x = adm.add_parser("ping", parents=[common, out], help="is the daemon answering?")
    x = adm.add_parser("list", parents=[common, out], help="pending-send (node) or stored (platform) rows")
    x.add_argument("--state", help="only rows in these states, e.g. SS_FAILED or SS_SENT,SS_ACK (semq help states)")
    x.add_argument("--target", metavar="ORG", help="only rows for this target organization")
    x.add_argument("--origin", help="platform: origin organization; node --table inbound: sender")
    x.add_argument("--older-than", type=parse_duration, metavar="DURATION", help="only rows older than this:"
                   " 30m, 2h, 1d")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N rows (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--after", type=int, help="only ids above this (paging)")
    x.add_argument("--table", choices=["outbox", "inbound"], help="node: pending-send (default) or pending-ack")
    x.add_argument("--kind", choices=["data", "relayed", "all"], help="platform: stored documents (default),"
                   " relayed acks/inquiries, or all")
    x = adm.add_parser("show", parents=[common, out], help="one record (no contents)")
    x.add_argument("record", help="record id, or an LK0 (NODE/1/1/ID)")
    x.add_argument("--table", choices=["outbox", "inbound"],
                   help="node: look in pending-send (default) or pending-ack")
    x = adm.add_parser("stuck", parents=[common, out], help="no end-to-end confirmation for too long, and where"
                       " (says how many younger ones it does not show)")
    x.add_argument("--older-than", type=parse_duration, metavar="DURATION",
                   help="unconfirmed for longer than this counts as stuck (default 1h)")
    x.add_argument("--limit", type=int, default=100, metavar="N", help=f"at most N rows (1..{MAX_LIMIT}, default 100)")
    adm.add_parser("requeue", parents=[common, out, sel],
                   help="node: failed rows back to SS_INIT; platform: delivered-unacked copies again")
    adm.add_parser("resend", parents=[common, out, sel], help="unconfirmed rows back to SS_INIT: sent again now")
    x = adm.add_parser("purge", parents=[common, out, sel], help="delete rows (logged as dead/dropped)")
    x.add_argument("--kind", choices=["data", "relayed", "all"], help="platform: which stored rows")
    for name, text in (("drain", "stop taking new work, finish in-flight, then stop"),
                       ("stop", "stop now (cleanly; unacknowledged work is resent later)")):
        x = adm.add_parser(name, parents=[common, out], help=text)
        x.add_argument("--reason", help="why, for the log and semq admin status")
        x.add_argument("--wait", type=float, nargs="?", const=120.0, default=0.0, metavar="S",
                       help="wait until the daemon is gone (default at most 120 s)")
    adm.add_parser("reload", parents=[common, out], help="re-read semq.toml and certificates (like SIGHUP)")
    for p in adm.choices.values():
        p.set_defaults(func=cmd_admin)
    x = adm.add_parser("grafana-dashboard", help="print the Grafana dashboard for the --metrics endpoint"
                       " (JSON, for Dashboards > New > Import)")
    x.add_argument("-o", "--output", metavar="FILE", help="write it to FILE instead of standard output")
    x.set_defaults(func=cmd_grafana_dashboard)

    svc = sub.add_parser("service", help="systemd units").add_subparsers(dest="service_cmd", required=True)
    x = svc.add_parser("install", parents=[common], help="write a systemd unit for this node or platform")
    x.add_argument("--role", required=True, choices=["node", "platform"],
                   help="what the data directory holds (checked against its semq.toml)")
    x.add_argument("--user", default="semq", help="the dedicated account it runs as (default semq)")
    x.add_argument("--group", help="the group it runs as (default: the user's name)")
    x.add_argument("--unit-dir", metavar="DIR", help="where to write the unit (default /etc/systemd/system)")
    x.add_argument("--metrics", metavar="HOST:PORT", help="start with --metrics HOST:PORT")
    x.add_argument("--print", action="store_true", help="print the unit; write nothing, check nothing")
    x.add_argument("--force", action="store_true",
                   help="replace a unit file that is there and differs (the difference is shown)")
    x.set_defaults(func=cmd_service_install)

    x = sub.add_parser("backup", parents=[common], help="consistent copy of the store (works while running)")
    x.add_argument("--out", required=True, metavar="FILE", help="FILE.tar, FILE.tar.gz or FILE.tgz, or FILE.sqlite (the store only), in a directory that exists")
    x.add_argument("--include-keys", action="store_true", help="also the private keys (keep the file safe!)")
    x.set_defaults(func=cmd_backup)

    x = sub.add_parser("compact", parents=[common],
                       help="rewrite the stopped store: this version's page size, free pages dropped")
    x.set_defaults(func=cmd_compact)

    x = sub.add_parser("restore", parents=[common], help="restore a backup (refuses a running store)")
    x.add_argument("file", help="the backup: FILE.tar, FILE.tar.gz or FILE.sqlite")
    x.add_argument("--force", action="store_true", help="replace an existing store (kept as *.before-restore-*)")
    x.set_defaults(func=cmd_restore)


def main(argv: list[str] | None = None) -> int:
    """Run the operational subcommands alone (``python -m semq.ops``)."""
    from semq.settings.config import ConfigError

    p = argparse.ArgumentParser(prog="semq", parents=[_common()])
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        rc: int = args.func(args)
        return rc
    except (ConfigError, ValueError) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
