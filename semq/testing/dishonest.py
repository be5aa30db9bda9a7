"""A dishonest relay, for testing what SEMQ promises against its own relay.

The relay operator runs the platform: its certificate authority, its TLS
key, its store and every frame it relays. ``DishonestPlatform`` is the real
platform daemon (``semq platform run``: same TLS, same store, same routing)
with an operator who cheats on the frames nodes send it, as a plan says:

``drop``
    swallow the matching frames (nothing forwarded, stored or acked).
``alter``
    change header fields no one but the origin should set — ``expires_ms``,
    ``created_ms``, ``priority``, ``ack2``, ``reliable`` — and relay the
    altered frame as usual (CRC recomputed: the bytes are well formed); with
    ``direct``, hand it straight to the target's connection, past the
    platform's own routing (which would refuse, say, an expiry in the past).
``delay``
    hold the matching frames ``seconds``, then handle them as usual.
``replay``
    relay them as usual, and send the target a copy again after ``seconds``.
``forge_ack2``
    swallow a DATA and send its origin an ACK2 in the target's name:
    ``receipt`` "none" (no receipt), "garbage" (bytes that look like one) or
    "replay" (the last genuine receipt the target sent that origin).
``forge_nack``
    swallow a DATA and send its origin a NACK in the target's name
    (``code``, default DECRYPT_FAILED), with no valid refusal.
``answer_received``
    answer the origin's "did you receive" inquiries (to the target, or to
    the platform) itself: ``result`` RECEIVED / FORWARDED / STORED.
``ask_state``
    swallow a DATA and send its origin a STATE inquiry in the target's name
    about it (as a receiver that lost its REACK2 would).
``tamper_chunk``
    change a CHUNK of a large document on its way (``how``: "flip" a byte
    of its payload, "move" it to the next index, "splice" it into the
    origin's next document) and relay it, well formed (CRC recomputed).

A rule matches on ``kind`` (a Kind name; ``ACK2`` matches ACK_BATCH frames of
ACK2 entries), ``source`` (the organization that sent it) and ``target``,
and applies to at most ``count`` frames (default: all). The plan is a JSON
file ``{"rules": [...]}``, read again whenever it changes, so a test can
start honest and turn dishonest mid-run. What was done is counted in the
daemon's ``stats`` (``status.json``: ``mischief_<action>``).

Run it as a process in place of ``semq platform run``::

    python -m semq.testing.dishonest --plan plan.json platform run --dir P --listen 127.0.0.1:0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

from semq.platform.core import PlatformCore, PlatformOutput
from semq.platform.daemon import PlatformDaemon, PlatformSettings, Session
from semq.umxt_protocol import (
    FLAG_ACK2,
    FLAG_RELIABLE,
    AckBatch,
    AckEntry,
    AckFlag,
    Chunk,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Inquiry,
    InquiryAnswer,
    InquiryFlag,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    NodeType,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
    relay_bytes,
    rewrite_header,
)

__all__ = ["DishonestPlatform", "Plan", "Rule", "main", "patch_data"]

log = logging.getLogger("semq.testing.dishonest")

ACTIONS: Final = frozenset({"drop", "alter", "delay", "replay", "forge_ack2", "forge_nack", "answer_received",
                            "ask_state", "tamper_chunk"})


@dataclass
class Rule:
    action: str
    kind: str = "DATA"
    source: str | None = None
    target: str | None = None
    count: int | None = None
    seconds: float = 0.0
    receipt: str = "none"
    result: str = "RECEIVED"
    code: str = "DECRYPT_FAILED"
    set: dict[str, int] = field(default_factory=dict)
    direct: bool = False
    how: str = "flip"
    done: int = 0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {sorted(ACTIONS)}")

    def matches(self, raw: RawFrame, kind: str) -> bool:
        if self.count is not None and self.done >= self.count:
            return False
        return (kind == self.kind and (self.source is None or raw.origin.node_id == self.source)
                and (self.target is None or raw.target.node_id == self.target))


@dataclass
class Plan:
    rules: list[Rule] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Plan:
        try:
            data = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls()
        return cls([Rule(**r) for r in data.get("rules", [])])


def patch_data(raw: RawFrame, changes: dict[str, int]) -> RawFrame:
    """A DATA frame with header fields changed (``expires_ms``, ``created_ms``,
    ``priority``, ``ack2``, ``reliable``): the times by encoding the frame
    again (canonical: every other byte stays), the flags and priority in
    the header (umxt_protocol.rewrite_header, valid or not), CRC made again:
    bytes a relay could send."""
    unknown = set(changes) - {"expires_ms", "created_ms", "priority", "ack2", "reliable"}
    if unknown:
        raise ValueError(f"cannot alter {sorted(unknown)}")
    b = raw.raw
    if "expires_ms" in changes or "created_ms" in changes:
        frame = raw.frame()
        body = frame.body
        assert isinstance(body, Data)
        body = dataclasses.replace(body, created_ms=changes.get("created_ms", body.created_ms),
                                   expires_ms=changes.get("expires_ms", body.expires_ms or 0) or None)
        b = encode_frame(dataclasses.replace(frame, body=body))
    flags = raw.flags
    for name, bit in (("ack2", FLAG_ACK2), ("reliable", FLAG_RELIABLE)):
        if name in changes:
            flags = (flags | bit) if changes[name] else (flags & ~bit)
    b = rewrite_header(b, flags=flags, priority=changes.get("priority"))
    dec = FrameDecoder()
    dec.receive_data(b)
    got = dec.next_frame()
    assert got is not None
    return got


def tamper_chunk(raw: RawFrame, how: str) -> RawFrame:
    """A CHUNK changed as ``how`` says (Rule.how), re-encoded: bytes a relay could send."""
    frame = raw.frame()
    c = frame.body
    assert isinstance(c, Chunk)
    if how == "flip":
        p = bytearray(c.payload)
        p[len(p) // 2] ^= 0x01
        c = dataclasses.replace(c, payload=bytes(p))
    elif how == "move":
        c = dataclasses.replace(c, index=c.index + 1)
    elif how == "splice":
        c = dataclasses.replace(c, lk0=dataclasses.replace(c.lk0, record_id=c.lk0.record_id + 1))
    else:
        raise ValueError(f"tamper_chunk how={how!r}: flip, move or splice")
    dec = FrameDecoder()
    dec.receive_data(encode_frame(dataclasses.replace(frame, body=c)))
    got = dec.next_frame()
    assert got is not None
    return got


def _kind_name(raw: RawFrame) -> str:
    if raw.kind is Kind.ACK_BATCH:
        try:
            body = raw.frame().body
        except RemoteProtocolError:
            return "ACK_BATCH"
        assert isinstance(body, AckBatch)
        return body.ack_kind.name
    return raw.kind.name


class DishonestPlatform(PlatformDaemon):
    """The platform daemon with a cheating operator (module docstring)."""

    def __init__(self, core: PlatformCore, settings: PlatformSettings, plan_path: Path) -> None:
        super().__init__(core, settings)
        self.plan_path = plan_path
        self._plan_mtime: float | None = None
        self.plan = Plan()
        self._nursery: trio.Nursery | None = None
        self._receipts: dict[tuple[str, str], bytes] = {}  # (receiver, origin) -> last genuine receipt
        self._reload()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            port = await nursery.start(super().run)
            task_status.started(port)

    def _reload(self) -> None:
        try:
            mtime = os.stat(self.plan_path).st_mtime
        except OSError:
            mtime = None
        if mtime != self._plan_mtime:
            self._plan_mtime = mtime
            self.plan = Plan.load(self.plan_path)
            log.warning("dishonest relay: plan now %s", [r.action for r in self.plan.rules])

    def _count(self, rule: Rule) -> None:
        rule.done += 1
        key = f"mischief_{rule.action}"
        self.stats[key] = self.stats.get(key, 0) + 1

    def _send_to(self, ep: Endpoint, frames: Sequence[bytes], after: float = 0.0) -> None:
        async def later() -> None:
            await trio.sleep(after)
            s = self.sessions.get(ep)
            if s is not None:
                s.enqueue(list(frames))

        if after <= 0:
            s = self.sessions.get(ep)
            if s is not None:
                s.enqueue(list(frames))
        elif self._nursery is not None:
            self._nursery.start_soon(later)

    def _handle_later(self, session: Session, raws: list[RawFrame], after: float) -> None:
        async def later() -> None:
            await trio.sleep(after)
            out = PlatformOutput()
            out = await self.gate.run(self.core.handle, session.endpoint, raws, self._room(raws), out)
            self._dispatch(out)

        if self._nursery is not None:
            self._nursery.start_soon(later)

    def _incoming(self, session: Session, msgs: list[RawFrame]) -> list[RawFrame]:
        self._reload()
        me = self.core.me
        keep: list[RawFrame] = []
        held: list[RawFrame] = []
        delay = 0.0
        for raw in msgs:
            kind = _kind_name(raw)
            if kind == "ACK2" and raw.kind is Kind.ACK_BATCH:
                body = raw.frame().body
                assert isinstance(body, AckBatch)
                if body.receipt:
                    self._receipts[(raw.origin.node_id, raw.target.node_id)] = body.receipt
            rule = next((r for r in self.plan.rules if r.matches(raw, kind)), None)
            if rule is None:
                keep.append(raw)
                continue
            self._count(rule)
            act = rule.action
            if act == "drop":
                continue
            if act == "alter":
                if rule.direct:
                    self._send_to(raw.target, [relay_bytes(patch_data(raw, rule.set), me)])
                else:
                    keep.append(patch_data(raw, rule.set))
            elif act == "tamper_chunk":
                keep.append(tamper_chunk(raw, rule.how) if raw.kind is Kind.CHUNK else raw)
            elif act == "delay":
                held.append(raw)
                delay = max(delay, rule.seconds)
            elif act == "replay":
                keep.append(raw)
                self._send_to(raw.target, [relay_bytes(raw, me)], after=rule.seconds or 1.0)
            elif act == "forge_ack2":
                lk0 = raw.data_prefix()[0]
                receipt = {"none": b"", "garbage": b"SQR1\x02" + os.urandom(124),
                           "replay": self._receipts.get((raw.target.node_id, raw.origin.node_id), b"")}[rule.receipt]
                entry = AckEntry(1, 1, 0, lk0.semq_id, lk0.semq_db_id, lk0.record_id, int(AckFlag.DELIVERY), 0)
                self._send_to(raw.origin, [encode_frame(Frame(
                    kind=Kind.ACK_BATCH, source=me, target=raw.origin, origin=raw.target,
                    body=AckBatch(ack_kind=Kind.ACK2, entries=(entry,), receipt=receipt)))])
            elif act == "forge_nack":
                lk0 = raw.data_prefix()[0]
                self._send_to(raw.origin, [encode_frame(Frame(
                    kind=Kind.NACK, source=me, target=raw.origin, origin=raw.target,
                    body=Nack(lk0=lk0, code=ResultCode[rule.code], message="refused (says the relay)")))])
            elif act == "ask_state":
                lk0 = raw.data_prefix()[0]
                self._send_to(raw.origin, [encode_frame(Frame(
                    kind=Kind.INQUIRY, source=me, target=raw.origin, origin=raw.target,
                    body=Inquiry(topic=InquiryTopic.STATE, items=(lk0,))))])
            elif act == "answer_received":
                q = raw.frame().body
                if not isinstance(q, Inquiry) or q.topic is not InquiryTopic.RECEIVED:
                    keep.append(raw)
                    continue
                result = InquiryResult[rule.result]
                speaker = raw.target  # the target, or the platform itself
                flag = InquiryFlag.FROM_PLATFORM if speaker.node_type is NodeType.PLATFORM else InquiryFlag.FROM_PEER
                self._send_to(raw.origin, [encode_frame(Frame(
                    kind=Kind.INQUIRY_RESP, source=me, target=raw.origin, origin=speaker,
                    body=InquiryResp(topic=q.topic, flag=flag,
                                     answers=tuple(InquiryAnswer(lk, result) for lk in q.items))))])
        if held:
            self._handle_later(session, held, delay)
        return keep


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m semq.testing.dishonest --plan FILE platform run ...``: the
    arguments after ``--plan FILE`` are ``semq``'s."""
    parser = argparse.ArgumentParser(prog="python -m semq.testing.dishonest", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True, type=Path, help="JSON plan, read again when it changes")
    parser.add_argument("semq", nargs=argparse.REMAINDER, help="semq platform run arguments")
    ns = parser.parse_args(argv)
    from functools import partial

    from semq.cli import build_parser, cmd_platform_run, run_command

    args = build_parser().parse_args(ns.semq)
    if args.func is not cmd_platform_run:
        parser.error("give 'platform run ...' after --plan FILE")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    args.func = partial(cmd_platform_run, daemon_class=partial(DishonestPlatform, plan_path=ns.plan.resolve()))
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
