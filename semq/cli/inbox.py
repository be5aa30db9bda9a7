"""``semq inbox``: the documents that arrived, listed, shown, saved,
acknowledged or followed as they arrive, as the node's operator or as a
user through the node's user socket."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semq.cli._common import (
    UsageError,
    app_key_shown,
    client_of,
    daemon_status,
    format_age,
    format_time,
)
from semq.cli.content import write_content
from semq.cli.users import token_of, user_client, user_options
from semq.ops.display import MAX_LIMIT, shown
from semq.umxt_protocol import ProtocolError

__all__ = ["INBOX_HEADER", "INBOX_LIMIT", "cmd_inbox", "doc_id", "register"]


INBOX_LIMIT = MAX_LIMIT  # documents one 'semq inbox' lists at most (shown: semq.ops.display)


def doc_id(text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"inbox document id {text!r} is not a number (see 'semq inbox')")
    return int(text)


def _check_limit(limit: int) -> int:
    if not 1 <= limit <= INBOX_LIMIT:
        raise UsageError(f"--limit {limit} is outside 1..{INBOX_LIMIT}")
    return limit


def _item_json(i: Any) -> dict[str, Any]:
    """An inbox document for --json (times stay ms since the epoch)."""
    return {"id": i.id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id, "from_user": i.from_user,
            "to_user": i.to_user, "channel": i.channel, "gap": i.gap, "app_key": str(i.app_key),
            "size": i.size, "received_ms": i.received_ms, "consumed": i.consumed_ms is not None,
            **({"path": str(i.path)} if i.path is not None else {})}


INBOX_HEADER = f"{'ID':>6}  {'FROM':<20} {'LK0':<28} {'APPKEY':<32} {'SIZE':>7}  {'RECEIVED':<19}"


def _inbox_line(d: dict[str, Any]) -> str:
    """One document as 'semq inbox' lists it (``d``: the JSON form, or the
    user socket's)."""
    sender = shown(d["from"] + (f"/{d['from_user']}" if d.get("from_user") else ""))
    ak = d["app_key"]
    key = app_key_shown(ak) if isinstance(ak, dict) else shown(ak)
    users = (f"  -> {shown(d['to_user'])}" if d.get("to_user") else "") + (
        f"  [{shown(d['channel'])}]" if d.get("channel") else "")
    return (f"{d['id']:>6}  {sender:<20} {d['lk0']:<28} {key:<32} {d['size']:>7}  {format_time(d['received_ms'])}"
            f" ({format_age(d['received_ms'])} ago){users}")


def _connecting(cfg: Any) -> str | None:
    """A note when the node's daemon runs but is not connected to the
    platform (what waits there has not arrived yet), from its status.json;
    None when it is connected or does not run."""
    st = daemon_status(cfg)
    if st is None or st.get("connected"):
        return None
    if not st.get("sessions"):
        return ("note: the node is still connecting to the platform (not connected since it started): documents"
                " waiting there arrive once it is; 'semq status' shows the connection")
    return ("note: the node is not connected to the platform now (it reconnects by itself): documents waiting"
            " there arrive once it is; 'semq status' shows the connection")


def _inbox_as_user(args: argparse.Namespace, token: str) -> int:
    with user_client(args, None, token) as me:  # (one connection, closed at the end)
        return _inbox_as(me, args)


def _inbox_as(me: Any, args: argparse.Namespace) -> int:
    """``semq inbox`` as a user, through the node's user socket (``me``)."""
    from semq.ops.usersock import UserSocketError

    try:
        if args.follow:
            return _follow(args, me.follow(args.after), lambda i: me.acknowledge([i["id"]]))
        if args.action == "list":
            items = me.inbox(unread=not args.all, limit=args.limit)
            if args.json:
                print(json.dumps(items))
                return 0
            print(INBOX_HEADER)
            for i in items:
                print(_inbox_line(i))
            print(f"{len(items)} document(s) for {args.user}", file=sys.stderr)
            return 0
        if not args.ids:
            raise UsageError(f"inbox {args.action} needs a document id or LK0")
        if args.action == "ack":
            return _ack_as(me, args)
        try:
            item = me.get(_resolve(me, args.ids[0], args.user))
        except (_NotInInbox, UserSocketError):
            print(f"error: document {args.ids[0]} is not in the inbox{_of(args.user)}", file=sys.stderr)
            return 1
    except UserSocketError as e:
        raise UsageError(str(e)) from None
    if args.action == "save" and len(args.ids) < 2:
        raise UsageError("inbox save needs ID FILE")
    try:
        if args.action == "save":
            if item.get("large"):  # by blocks, never whole
                n = me.save(item["id"], args.ids[1])
            else:
                n = Path(args.ids[1]).write_bytes(item["data"])
            print(f"saved {n} bytes to {args.ids[1]}")
            return 0
        blocks = me.read(item["id"]) if item.get("large") else [item["data"]]  # (a large one by blocks)
        if not write_content(blocks, sys.stdout.buffer, text_only=_text_only(args)):
            return _not_text(item["id"], item["size"])
    except UserSocketError as e:
        raise UsageError(str(e)) from None
    sys.stdout.flush()
    return 0


def _resolve(me: Any, text: str, user: str) -> int:
    """The inbox id of a user's document named by its id or its LK0."""
    if text.isdigit():
        return int(text)
    lk0 = _lk0_arg(text)
    for i in me.inbox(unread=False, limit=INBOX_LIMIT):
        if i["lk0"] == str(lk0):
            return int(i["id"])
    raise _NotInInbox(f"document {text} is not in the inbox of {user}")


def _ack_as(me: Any, args: argparse.Namespace) -> int:
    """``semq inbox ack`` as a user: 1 when one of the documents is not in
    its inbox (the others are acknowledged)."""
    from semq.ops.usersock import UserSocketError

    rc = 0
    ids = []
    for text in args.ids:
        try:
            item_id = _resolve(me, text, args.user)
            me.get(item_id)
        except (_NotInInbox, UserSocketError):
            print(f"error: document {text} is not in the inbox{_of(args.user)}", file=sys.stderr)
            rc = 1
            continue
        ids.append(item_id)
    if ids:
        print(f"acknowledged {me.acknowledge(ids)}")
    return rc


def _text_only(args: argparse.Namespace) -> bool:
    """``inbox show`` to a terminal writes only text, unless ``--raw``."""
    return not args.raw and sys.stdout.isatty()


def _not_text(item_id: int, size: int) -> int:
    """The line ``inbox show`` says instead of writing binary content to a terminal."""
    sys.stdout.flush()
    print(f"error: document {item_id} ({size} bytes) is not text (binary, or control characters): not written to"
          f" the terminal; add --raw to write it anyway, or save it with 'semq inbox save {item_id} FILE'",
          file=sys.stderr)
    return 1


class _NotInInbox(Exception):
    pass


def _of(user: str | None) -> str:
    """`` of alice`` for a user's inbox, nothing for the organization's."""
    return f" of {user}" if user else ""


def _lk0_arg(text: str) -> Any:
    from semq.umxt_protocol import LK0

    try:
        return LK0.parse(text)
    except ProtocolError:
        raise UsageError(f"{text!r} is neither an inbox document id nor an LK0 (ORG/SEMQ_ID/DB_ID/RECORD_ID)") from None


def _follow(args: argparse.Namespace, items: Any, ack: Callable[[Any], Any]) -> int:
    """``--follow``: each document as it arrives, one line (or one JSON
    line), flushed; ``--ack`` acknowledges each once it is printed."""
    try:
        if not args.json:
            print(INBOX_HEADER, flush=True)
        for item in items:
            d = item if isinstance(item, dict) else _item_json(item)
            if args.json:
                d = {k: v for k, v in d.items() if k != "data"}
                print(json.dumps(d), flush=True)
            else:
                print(_inbox_line(d), flush=True)
            if args.ack:  # only once it was written
                ack(item)
    except BrokenPipeError:
        # The reader went away ('semq inbox --follow | head -1'): done, and
        # the document that did not get out is not acknowledged.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def cmd_inbox(args: argparse.Namespace) -> int:
    _check_limit(args.limit)
    if args.ack and not args.follow:
        raise UsageError("--ack goes with --follow (to acknowledge documents by id: semq inbox ack ID...)")
    if args.follow and args.action != "list":
        raise UsageError(f"--follow lists documents as they arrive; not with 'inbox {args.action}'")
    token = token_of(args)
    if token is not None:
        return _inbox_as_user(args, token)
    with client_of(args) as node:
        if args.follow:
            return _follow(args, node.follow(args.after, user=args.user),
                           lambda i: node.acknowledge([i.id], user=args.user))
        if args.action == "list":
            items = node.inbox(unread=not args.all, limit=args.limit, user=args.user)
            if args.json:
                print(json.dumps([_item_json(i) for i in items]))
                return 0
            print(INBOX_HEADER)
            for i in items:
                print(_inbox_line(_item_json(i)))
            total = node.inbox_count(unread=not args.all, user=args.user) if len(items) == args.limit else len(items)
            if total > len(items):
                print(f"{len(items):,} of {total:,} document(s), the oldest first (--limit N lists up to"
                      f" {INBOX_LIMIT:,}; acknowledged ones leave the list)", file=sys.stderr)
            else:
                print(f"{len(items)} document(s)", file=sys.stderr)
            note = _connecting(node.config)
            if note:
                print(note, file=sys.stderr)
            return 0
        if not args.ids:
            raise UsageError(f"inbox {args.action} needs a document id or LK0")
        if args.action == "ack":
            return _ack(node, args)
        try:
            item = _find(node, args.ids[0], args.user)
        except KeyError:
            print(f"error: document {args.ids[0]} is not in the inbox{_of(args.user)}", file=sys.stderr)
            return 1
        if args.action == "save":
            if len(args.ids) < 2:
                raise UsageError("inbox save needs ID FILE")
            item.save(Path(args.ids[1]))
            print(f"saved {item.size} bytes to {args.ids[1]}")
            return 0
        return _show(item, args)


def _find(node: Any, text: str, user: str | None) -> Any:
    """A document of the inbox named by its id or its LK0 (KeyError if none)."""
    if text.isdigit():
        return node.get(int(text), user=user)
    return node.find(_lk0_arg(text), user=user)


def _ack(node: Any, args: argparse.Namespace) -> int:
    """``semq inbox ack``: 1 when one of the documents is not in the inbox
    (the others are acknowledged); one acknowledged already is said."""
    rc = 0
    ids = []
    for text in args.ids:
        try:
            item = _find(node, text, args.user)
        except KeyError:
            print(f"error: document {text} is not in the inbox{_of(args.user)}", file=sys.stderr)
            rc = 1
            continue
        if item.consumed_ms is not None:
            print(f"document {text} was acknowledged already, {format_time(item.consumed_ms)}",
                  file=sys.stderr)
            continue
        ids.append(item.id)
    if ids:
        print(f"acknowledged {node.acknowledge(ids, user=args.user)}")
    return rc


def _show(item: Any, args: argparse.Namespace) -> int:
    """``semq inbox show``: the document's fields, then its contents (text
    only on a terminal, unless ``--raw``)."""
    who = "".join(f"\n{k}: {shown(v)}" for k, v in (("from_user", item.from_user), ("to_user", item.to_user),
                                                     ("channel", item.channel)) if v)
    acked = (f"\nacknowledged: {format_time(item.consumed_ms)}" if item.consumed_ms is not None
             else "\nacknowledged: no")
    print(f"id: {item.id}\nlk0: {item.lk0}\nfrom: {shown(item.lk0.endpoint.node_id)}{who}"
          f"\napp_key: {app_key_shown(item.app_key)}\nsave_fwd: {item.save_fwd}\npriority: {item.priority}"
          f"\nsize: {item.size}" + (f"\nfile: {item.path}" if item.path is not None else "")
          + f"\ncreated: {format_time(item.created_ms)}"
          f"\nreceived: {format_time(item.received_ms)} ({format_age(item.received_ms)} ago){acked}\n")
    sys.stdout.flush()
    with item.open() as f:  # (a large document by blocks, never whole in memory)
        if not write_content(iter(lambda: f.read(1 << 20), b""), sys.stdout.buffer, text_only=_text_only(args)):
            return _not_text(item.id, item.size)
    sys.stdout.flush()
    return 0

def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq inbox``."""
    x = sub.add_parser(
        "inbox", parents=[common], help="documents that arrived",
        description=textwrap.fill("List the documents that arrived (unacknowledged ones by default), show or save one, acknowledge"
                    " them, or follow the inbox: each document printed as it arrives, woken by the running node"
                    " daemon (no polling).", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  semq inbox --dir B                      # unacknowledged documents, oldest first\n"
               "  semq inbox --dir B show 17              # one document: its fields, then its contents\n"
               "  semq inbox --dir B show 10008/1/1/1795329835412001   # the same, by its LK0\n"
               "  semq inbox --dir B save 17 order.xml\n"
               "  semq inbox --dir B ack 17 18\n"
               "  semq inbox --dir B --follow --json      # one JSON line per document as it arrives\n"
               "  semq inbox --dir B --follow --ack       # print each new document, then acknowledge it")
    x.add_argument("action", nargs="?", default="list", choices=["list", "show", "save", "ack"],
                   help="list (default); show ID|LK0: its fields and contents; save ID|LK0 FILE: its contents to"
                        " FILE; ack ID|LK0...: the application has processed them")
    x.add_argument("ids", nargs="*", metavar="ID|LK0", help="inbox document ids (the ID column) or LK0s")
    x.add_argument("--all", action="store_true", help="include acknowledged documents (list)")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"list at most N documents, 1..{INBOX_LIMIT} (default 100)")
    x.add_argument("--json", action="store_true",
                   help="JSON for programs (times in ms since the epoch); with --follow one JSON object per line")
    x.add_argument("--follow", "-f", action="store_true",
                   help="print each unacknowledged document, then each new one as it arrives, until interrupted"
                        " (the node daemon wakes it; without a daemon it tries again every second)")
    x.add_argument("--after", type=int, default=0, metavar="ID",
                   help="--follow: start with the documents above inbox id ID (default 0: every unacknowledged one)")
    x.add_argument("--ack", action="store_true", help="--follow: acknowledge each document once it is printed")
    x.add_argument("--raw", action="store_true",
                   help="show: write the contents to a terminal even when they are not text (without it, binary"
                        " contents or control characters are refused on a terminal; a pipe or a file always gets"
                        " the bytes)")
    user_options(x, "only this user's documents")
    x.set_defaults(func=cmd_inbox)
