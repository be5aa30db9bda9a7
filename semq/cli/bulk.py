"""``semq send`` with many documents: several files, a directory, or NDJSON
lines (one document each), accepted in transactions of ``--batch``
documents (``NodeClient.send_many``), one LK0 per document on stdout in
input order, a summary on stderr.

What is refused and when: the files named (or found in the directory) are
all checked before anything is sent — each exists, fits the document
limit, and with ``--key-from-name`` makes a valid key — so a bad file
leaves nothing sent. NDJSON is read as a stream: each batch is checked
whole before it is sent, so a bad line stops the command with nothing of
its batch accepted; the batches before it stay accepted (they are durable
in the store, and their LK0s were printed).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

from semq.cli._common import (
    UsageError,
    check_address,
    check_colleague,
    client_of,
    config_of,
    warn_unknown_target,
)
from semq.cli.users import token_of
from semq.node.limits import check_document_size
from semq.settings.config import Config
from semq.umxt_protocol import AppKey, LocalProtocolError

__all__ = ["BULK_BATCH", "BULK_BATCH_BYTES", "NDJSON_FIELDS", "cmd_send_bulk", "directory_refused", "file_problem",
           "format_size", "progress_bar", "warn_empty"]

BULK_BATCH: Final = 1000  # documents per transaction (send_many)
BULK_BATCH_BYTES: Final = 64 << 20  # ... and at most this many bytes of them, so memory stays bounded
# An NDJSON line: one of data (UTF-8 text), data_b64 or file, and optionally these.
NDJSON_FIELDS: Final = ("data", "data_b64", "file", "key", "type", "domain", "subtype", "priority", "to")
_CONTENT: Final = ("data", "data_b64", "file")
PROGRESS_DELAY: Final = 0.5  # s: a run shorter than this shows no progress bar


class _Item(NamedTuple):
    """One document to send: ``where`` names it in an error (a path, ``line 17``)."""

    where: str
    doc: dict[str, Any]


def format_size(n: int) -> str:
    """``512 bytes``, ``3.4 KiB``, ``3.4 MiB``, ``1.2 GiB``."""
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 ** 2:
        return f"{n / 1024:.1f} KiB"
    if n < 1024 ** 3:
        return f"{n / 1024 ** 2:.1f} MiB"
    return f"{n / 1024 ** 3:.1f} GiB"


class _Checks:
    """Checks an item's fields as the node would, naming the item: a
    target (once per distinct ``to``), the size, the AppKey, the priority."""

    def __init__(self, cfg: Config, node: Any) -> None:
        self.cfg = cfg
        self.node = node
        self.targets: dict[str, str] = {}  # to -> its organization, checked
        # organization -> whether the node knew it before this command (asked
        # when first seen, before anything is sent to it: semq send's warning)
        self.known: dict[str, bool] = {}

    def item(self, where: str, doc: dict[str, Any]) -> None:
        try:
            to = doc["to"]
            if to not in self.targets:
                org = check_address(to, self.cfg.org)
                check_colleague(self.node, to)
                self.targets[to] = org
                if org not in self.known:
                    self.known[org] = org == self.cfg.org or self.node.knows(org)
            check_document_size(len(doc["data"]))
            AppKey(domain=doc["domain"], data_type=doc["data_type"], subtype=doc["subtype"], key=doc["key"])
            p = doc["priority"]
            if type(p) is not int or not 0 <= p <= 9:
                raise UsageError(f"priority {p!r} is outside 0..9")
        except (UsageError, LocalProtocolError) as e:
            raise UsageError(f"{where}: {e}") from None


def _base(args: argparse.Namespace) -> dict[str, Any]:
    """The document options the command line gives every document."""
    return dict(to=args.to, data_type=args.type or "", domain=args.domain, subtype=args.subtype, key=args.key,
                save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                reliable=not args.best_effort, encrypt=not args.no_encrypt, clear_app_key=args.clear_app_key,
                ordered=args.ordered, user=args.user)


_KINDS: Final = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def file_problem(name: str) -> str | None:
    """Why ``name`` cannot be sent as a document's file (missing, or not a
    regular file: ``/dev/null`` is a character device, whose content
    would be nothing or never end), in one line; None for a regular file."""
    try:
        mode = Path(name).stat().st_mode
    except FileNotFoundError:
        return f"no such file: {name}"
    except OSError as e:
        return f"cannot read {name}: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return f"{name} is {kind}, not a regular file; send a regular file, or - to read standard input"


def warn_empty(names: list[str]) -> None:
    """One warning line for files of 0 bytes: sent as empty documents,
    seldom what was meant, but not refused."""
    if len(names) == 1:
        print(f"warning: {names[0]} is empty (0 bytes); it is sent as an empty document", file=sys.stderr)
    elif names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        print(f"warning: {len(names)} files are empty (0 bytes) and are sent as empty documents: {shown}",
              file=sys.stderr)


def _files(names: list[str], each_file: bool) -> list[Path]:
    """The files named, a directory's regular files (directly in it, in name
    order) in its place when ``each_file``; UsageError for a name that is
    neither, or a directory without it."""
    out: list[Path] = []
    for name in names:
        if name == "-":
            raise UsageError("- (standard input) is one document alone, or NDJSON with --ndjson; not with"
                             " other files")
        p = Path(name)
        if p.is_dir():
            if not each_file:
                raise UsageError(directory_refused(name))
            out += sorted((c for c in p.iterdir() if c.is_file()), key=lambda c: c.name)
            continue
        why = file_problem(name)
        if why is not None:
            raise UsageError(why)
        out.append(p)
    return out


def directory_refused(name: str) -> str:
    return f"{name} is a directory; to send each regular file in it as one document, add --each-file"


def _file_items(paths: list[Path], args: argparse.Namespace, checks: _Checks) -> tuple[list[_Item], int]:
    """Every file checked by its size and name before anything is sent; the
    items (contents read later, batch by batch) and their total size."""
    base = _base(args)
    items = []
    total = 0
    for p in paths:
        size = p.stat().st_size
        try:
            check_document_size(size)
        except LocalProtocolError as e:
            raise UsageError(f"{p}: {e}") from None
        doc = {**base, "key": p.stem if args.key_from_name else args.key, "data": b"", "path": p}
        checks.item(str(p), doc)
        items.append(_Item(str(p), doc))
        total += size
    warn_empty([str(p) for p in paths if p.stat().st_size == 0])
    return items, total


def _read(item: _Item) -> _Item:
    path = item.doc.get("path")
    if path is None:
        return item
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    doc = {k: v for k, v in item.doc.items() if k != "path"}
    doc["data"] = data
    return _Item(item.where, doc)


def _ndjson_items(stream: IO[bytes], args: argparse.Namespace) -> Iterator[_Item]:
    """One item per non-blank line; UsageError naming the line for one that
    is not a JSON object of the NDJSON_FIELDS with exactly one content."""
    base = _base(args)
    for n, raw in enumerate(stream, 1):
        where = f"line {n}"
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError(f"{where}: not a JSON object: {e}") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: not a JSON object but {type(obj).__name__}")
        unknown = sorted(set(obj) - set(NDJSON_FIELDS))
        if unknown:
            raise UsageError(f"{where}: unknown field {json.dumps(unknown[0])}; allowed: {', '.join(NDJSON_FIELDS)}")
        given = [f for f in _CONTENT if f in obj]
        if len(given) != 1:
            raise UsageError(f"{where}: needs exactly one of data, data_b64, file (has"
                             f" {', '.join(given) or 'none'})")
        for f in ("data", "data_b64", "file", "key", "type", "domain", "subtype", "to"):
            if f in obj and not isinstance(obj[f], str):
                raise UsageError(f"{where}: {f} is {type(obj[f]).__name__}, not a string")
        doc = dict(base)
        for f, col in (("key", "key"), ("type", "data_type"), ("domain", "domain"), ("subtype", "subtype"),
                       ("to", "to"), ("priority", "priority")):
            if f in obj:
                doc[col] = obj[f]
        if "data" in obj:
            doc["data"] = obj["data"].encode("utf-8", "surrogatepass")
        elif "data_b64" in obj:
            try:
                doc["data"] = base64.b64decode(obj["data_b64"], validate=True)
            except (binascii.Error, ValueError) as e:
                raise UsageError(f"{where}: data_b64 is not base64: {e}") from None
        else:
            p = Path(obj["file"])
            why = file_problem(obj["file"])
            if why is not None:
                raise UsageError(f"{where}: {why}")
            doc["data"] = b""
            doc["path"] = p
            if args.key_from_name and "key" not in obj:
                doc["key"] = p.stem
        yield _Item(where, doc)


def _batches(items: Iterable[_Item], size: int) -> Iterator[list[_Item]]:
    """Items in batches of at most ``size`` documents and BULK_BATCH_BYTES,
    each handed on as soon as it is full (so a bad item later on does not
    hold back a batch before it)."""
    batch: list[_Item] = []
    nbytes = 0
    for item in items:
        item = _read(item)
        n = len(item.doc["data"])
        if batch and nbytes + n > BULK_BATCH_BYTES:
            yield batch
            batch, nbytes = [], 0
        batch.append(item)
        nbytes += n
        if len(batch) >= size:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def _documents_in(path: Path) -> int:
    """The documents of an NDJSON file: its lines that are not blank."""
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def progress_bar(total: int | None, unit: str) -> Any:
    """A progress bar on stderr when it is a terminal and the run lasts more
    than PROGRESS_DELAY; None otherwise."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    if unit == "B":  # files: their bytes, known beforehand
        return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, delay=PROGRESS_DELAY,
                    file=sys.stderr, leave=False, dynamic_ncols=True)
    return tqdm(total=total, unit=" documents", delay=PROGRESS_DELAY, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def cmd_send_bulk(args: argparse.Namespace) -> int:
    """``semq send`` with several files, a directory, or ``--ndjson``."""
    if token_of(args) is not None:
        raise UsageError("sending several documents is for the node's operator (it writes the node's store),"
                         " not through a user's token")
    if args.transactional:
        raise UsageError("--transactional stores one half message: give one file")
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch} is not a positive number of documents")
    if not args.ndjson and args.type is None:
        raise UsageError("--type is required: the AppKey data type, e.g. ORDER")
    if args.ndjson and len(args.files) != 1:
        raise UsageError(f"--ndjson reads one input (a file, or - for standard input), not {len(args.files)}")
    cfg = config_of(args, "node")
    total: int | None = None
    count = 0  # files: how many (their bar counts bytes)
    with client_of(args) as node, ExitStack() as closing:
        checks = _Checks(cfg, node)
        items: Iterable[_Item]
        if args.ndjson:
            name = args.files[0]
            why = None if name == "-" else file_problem(name)
            if why is not None:
                raise UsageError(why)
            if name == "-":
                stream: IO[bytes] = sys.stdin.buffer
            else:
                stream = closing.enter_context(Path(name).open("rb"))
                if sys.stderr.isatty():  # the bar's total and time left: the file's documents
                    total = _documents_in(Path(name))
            items = _ndjson_items(stream, args)
            unit = "doc"
        else:
            listed, total = _file_items(_files(args.files, args.each_file), args, checks)
            items, count, unit = listed, len(listed), "B"
        sent = size = 0
        start = time.monotonic()
        bar = progress_bar(total, unit)
        try:
            for batch in _batches(items, args.batch):
                for item in batch:
                    checks.item(item.where, item.doc)
                try:
                    lk0s = node.send_many([item.doc for item in batch])
                except LocalProtocolError as e:  # a field the checks above do not know
                    raise UsageError(f"{batch[0].where} .. {batch[-1].where}: {e}; nothing of these"
                                     f" {len(batch)} was accepted") from None
                text = "".join(f"{lk0}\n" for lk0 in lk0s)
                if bar is not None:
                    with bar.external_write_mode(file=sys.stdout):
                        sys.stdout.write(text)
                        sys.stdout.flush()
                else:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                n = sum(len(item.doc["data"]) for item in batch)
                sent += len(batch)
                size += n
                if bar is not None:
                    if unit == "B":  # bytes, and the documents beside them
                        bar.set_postfix_str(f"{sent:,} of {count:,} documents", refresh=False)
                    bar.update(n if unit == "B" else len(batch))
        finally:
            if bar is not None:
                bar.close()
        seconds = time.monotonic() - start
    for org, k in checks.known.items():
        warn_unknown_target(k, org)
    if not args.quiet:
        targets = list(dict.fromkeys(checks.targets))
        to = ", ".join(targets[:3]) + (f" and {len(targets) - 3} more" if len(targets) > 3 else "")
        took = f"{seconds:.2f}" if seconds < 10 else f"{seconds:.0f}"
        print(f"accepted {sent} document{'s' if sent != 1 else ''} ({format_size(size)})"
              f"{f' for {to}' if to else ''} in {took} s: stored in this node, which sends them"
              " ('semq messages' shows how far each got)", file=sys.stderr)
    return 0
