"""``semq help TOPIC``: the states, result codes and protocol terms a user
meets in ``semq messages``, ``semq status``, ``semq admin`` and the logs,
printed from the definitions the code runs on — the IntEnums of the
engines and of semq.umxt_protocol, one line per member from the comment on
that member — so the help cannot drift from the code (a test checks that
every member appears)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from enum import Enum
from functools import cache
from typing import Any

from semq.node.engine import ORIGIN_TABLE, AckStatus, OriginEvent, SendState, TxState
from semq.platform.engine import STORED_TABLE, StoredEvent, StoredState
from semq.umxt_protocol import LK0, MAX_NODE_ID, AckFlag, Kind, ResultCode, SaveFwd
from semq.umxt_protocol._types import MAX_RECORD_ID, MAX_SEMQ_ID

__all__ = ["TOPICS", "member_meanings", "topic_text"]

_MEMBER = re.compile(r"^\s+([A-Z][A-Z0-9_]*)\s*=\s*[^#\n]*#\s*(.+?)\s*$")
# Where a rule came from (the seeds, the SPEC) is for the code's readers, not for the user.
_SOURCE_NOTE = re.compile(r"\s*\((?:seed|STYLE|SPEC)[^()]*\)|\s*\bseed \d{3}\b[^,;)]*", re.IGNORECASE)
# A comment beginning with a section label ("1xx: ...") introduces a range.
_SECTION = re.compile(r"^\s+#\s*(\dxx: [^(]+?)\s*(?:\(.*\))?\s*$")


@cache
def member_meanings(cls: type[Enum]) -> dict[str, str]:
    """Each member's name -> the comment on its line in the class's source
    (without notes on where the rule came from). Raises LookupError naming
    a member that has no comment."""
    out: dict[str, str] = {}
    for line in inspect.getsource(cls).splitlines():
        m = _MEMBER.match(line)
        if m and m.group(1) in cls.__members__:
            out[m.group(1)] = _SOURCE_NOTE.sub("", m.group(2)).replace("``", "").strip()
    missing = [name for name in cls.__members__ if name not in out]
    if missing:
        raise LookupError(f"{cls.__name__}.{missing[0]} has no comment to explain it")
    return out


def _sections(cls: type[Enum]) -> dict[str, str]:
    """Member name -> the section label comment above it (``1xx: ...``)."""
    out: dict[str, str] = {}
    label = ""
    for line in inspect.getsource(cls).splitlines():
        s = _SECTION.match(line)
        if s:
            label = s.group(1)
            continue
        m = _MEMBER.match(line)
        if m and label:
            out[m.group(1)] = label
    return out


def _members(cls: type[Enum], *, value: bool = True, only: tuple[Enum, ...] = ()) -> list[str]:
    meanings = member_meanings(cls)
    names = [m.name for m in cls if not only or m in only]
    width = max(len(n) for n in names)
    lines = []
    for member in cls:
        if only and member not in only:
            continue
        v = f"{member.value:>4}  " if value else ""
        lines.append(f"  {v}{member.name:<{width}}  {meanings[member.name]}")
    return lines


def _moves(table: dict[Any, Any], states: type[Enum], events: type[Enum]) -> list[str]:
    """How each state moves, from a transition table ``(state, event) ->
    next`` (or ``(next, ...)``): one line per state, self-loops left out;
    then what each event is."""
    meanings = member_meanings(events)
    moves: dict[tuple[str, str], list[str]] = {}
    for state in states:
        for (st, e), nxt in table.items():
            to = nxt[0] if isinstance(nxt, tuple) else nxt
            if st is state and to is not state:
                moves.setdefault((state.name, to.name), []).append(str(e.value))
    w = max(len(m.name) for m in states)
    lines = [f"    {a:<{w}} -> {b:<{w}}  on {', '.join(evs)}" for (a, b), evs in moves.items()]
    width = max(len(str(e.value)) for e in events)
    return [*lines, "  where:", *(f"    {e.value:<{width}}  {meanings[e.name]}" for e in events)]


def _states() -> str:
    return "\n".join([
        "States of the rows a node and the platform keep for each document.",
        "",
        "The origin's pending-send rows (semq messages, semq status, semq admin list):",
        *_members(SendState),
        "  A confirmed row is cleaned up; a failed one stays 7 days (semq dead lists it).",
        "  How they move:",
        *_moves(ORIGIN_TABLE, SendState, OriginEvent),
        "",
        "The receiver's pending-ack rows (semq admin list --table inbound), one status for the",
        "platform's confirmation (P_ACK) and one for the origin's (S_ACK):",
        *_members(AckStatus),
        "  The row is deleted once both are AS_ACK.",
        "",
        "The platform's stored copies (semq admin list on a platform; ids form LK1):",
        *_members(StoredState),
        "  How they move:",
        *_moves(STORED_TABLE, StoredState, StoredEvent),
        "",
        "Transactional half messages (semq tx list):",
        *_members(TxState),
        "",
        "The codes in these rows: semq help codes.",
    ])


def _codes() -> str:
    meanings, sections = member_meanings(ResultCode), _sections(ResultCode)
    lines = ["Result codes: in NACK, ERROR and BYE frames, in the CODE column of semq messages and",
             "semq admin, in semq dead and in the logs.", ""]
    label = None
    for code in ResultCode:
        section = sections.get(code.name, "")
        if section != label and section:
            lines.append(f" {section}")
        label = section
        lines.append(f"  {code.value:>3}  {code.name:<24} {meanings[code.name]}")
    return "\n".join(lines)


def _savefwd() -> str:
    return "\n".join([
        "SaveFwd: what happens to a document when its target is not online (semq send --save-fwd N;",
        "default 3). The column SF in semq messages and semq admin list.",
        "",
        *_members(SaveFwd, only=(SaveFwd.DISCARD, SaveFwd.STORE, SaveFwd.MUST_DELIVER)),
        "",
        f"  1: the origin's row ends in SS_FAILED with code {ResultCode.TARGET_OFFLINE_DROPPED.value}"
        f" ({ResultCode.TARGET_OFFLINE_DROPPED.name}).",
        "  2 and 3: the platform stores it and delivers it when the target connects; with 3 the",
        "  origin also keeps it until the target confirms it end to end (ACK2), asks, and resends.",
        "  --best-effort (Reliable=0) is never stored, acknowledged or retried, whatever SaveFwd says.",
    ])


def _lk0() -> str:
    doc = " ".join((LK0.__doc__ or "").split())
    return "\n".join([
        f"LK0: {doc}.",
        "",
        "  Written ORG/SEMQ_ID/DB_ID/RECORD_ID, e.g. 10008/1/1/1795329835412001:",
        f"  ORG        the sending organization's id (at most {MAX_NODE_ID} characters)",
        f"  SEMQ_ID    the store's instance number, 1..{MAX_SEMQ_ID}",
        f"  DB_ID      the store's database number, 1..{MAX_SEMQ_ID}",
        f"  RECORD_ID  the record in that store, 1..{MAX_RECORD_ID}; a store's ids start at its creation",
        "             time in microseconds, so a node set up again never reuses one",
        "",
        "  semq send prints it; semq messages, semq inbox, semq track and semq admin show take it.",
        "  The platform's stored copy has its own key, LK1 (the platform's endpoint and the copy's id).",
    ])


_ACK_FAMILY = (Kind.ACK, Kind.REACK, Kind.ACK2, Kind.REACK2, Kind.ACK_FWD, Kind.ACK_SAVE, Kind.NACK,
               Kind.ACK_BATCH)


def _ack2() -> str:
    return "\n".join([
        "ACK2: the end-to-end confirmation. The receiver sends it to the origin once the document is",
        "in its inbox (with security, with its signed receipt: semq messages --receipt LK0); the",
        "origin's row becomes SS_ACK2 and is cleaned up. semq send --no-ack2 asks for none.",
        "",
        "The acknowledgements, by the hop they confirm:",
        *_members(AckFlag),
        "",
        "The frames:",
        *_members(Kind, only=_ACK_FAMILY),
    ])


TOPICS: dict[str, tuple[str, Callable[[], str]]] = {
    "states": ("the states of sending, receiving and stored rows (SS_*, AS_*)", _states),
    "codes": ("every result code with its meaning", _codes),
    "savefwd": ("what SaveFwd 1, 2 and 3 do when the target is offline", _savefwd),
    "lk0": ("a document's id (ORG/SEMQ_ID/DB_ID/RECORD_ID)", _lk0),
    "ack2": ("the end-to-end confirmation and the other acknowledgements", _ack2),
}


def topic_text(name: str) -> str:
    """The text of topic ``name`` (KeyError for an unknown one)."""
    return TOPICS[name.lower()][1]()
