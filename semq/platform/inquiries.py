"""What is addressed to the platform itself, and what it asks: its side of
SPEC P.2-P.3 and A.5 / B.2.

- The targets' ACKs of stored copies (answered with REACK after the
  commit), and a NACK OVER_WINDOW of a copy a target refused beyond its
  window (seed 004): applied through ``STORED_TABLE``.
- Inquiries: an origin's "did you receive it?" (answered from what became
  of the document: ``StoredCopies.fate``), a target's "what state is my
  copy in?" (answered, and the copy settled: the target has it).
- The targets' answers to the platform's own inquiries, and the rounds of
  those: online targets asked about copies delivered but not acked.

Owns no table: every row is ``StoredCopies``'s (semq.platform.copies)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Final

from semq.umxt_protocol import (
    LK0,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    Frame,
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
    ResultCode,
    encode_frame,
)
from semq.umxt_protocol.units import route_org

from .batch import PlatformBatch
from .copies import StoredCopies
from .engine import StoredEvent, state_answer

__all__ = ["Inquiries"]

_PER_INQUIRY: Final = 1000  # documents one INQUIRY of a round asks about
_PLATFORM_FLAG: Final = int(AckFlag.PLATFORM)


class Inquiries:
    """The frames for the platform itself within a batch (``handlers``, by
    kind), and its rounds of inquiries; inside the caller's transaction."""

    def __init__(self, me: Endpoint, copies: StoredCopies, inquiry_ms: int) -> None:
        self.me = me
        self.copies = copies
        self.inquiry_ms = inquiry_ms  # the interval (a reload changes it)
        self.handlers: dict[Kind, Callable[[PlatformBatch, Endpoint, RawFrame], None]] = {
            Kind.ACK: self.acks, Kind.ACK_BATCH: self.acks,
            Kind.NACK: self.refused,
            Kind.INQUIRY: self.inquiry,
            Kind.INQUIRY_RESP: self.answers,
        }

    @staticmethod
    def other(b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """Any other kind for the platform (PING, PONG, WINDOW, ... are the
        daemon's): its body decoded (a malformed one is refused), then ignored."""
        raw.frame()

    def acks(self, b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """The target's ACKs of stored copies (SPEC P.2): deleted, and
        answered REACK after the commit; what was in flight is credit."""
        frame = raw.frame()
        body = frame.body
        entries: Sequence[AckEntry] = ()
        if isinstance(body, AckBatch) and body.ack_kind is Kind.ACK:
            entries = body.entries
        elif isinstance(body, Ack) and frame.kind is Kind.ACK:
            entries = (body.entry,)
        if not entries:
            return
        gone = self.copies.settle([e.dest_ref_id for e in entries], StoredEvent.ACK, sender, b.ts, b.events)
        b.out.credit[sender] += gone
        reacks = b.acks[(Kind.REACK, sender)]
        for e in entries:
            reacks.append(AckEntry(1, 1, e.dest_ref_id, e.src_semq_id, e.src_semq_db_id, e.src_ref_id,
                                   _PLATFORM_FLAG, 0))

    def refused(self, b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """The node refused a copy beyond its window (seed 004): a stored
        one goes back to the queue and out again, at a smaller window. A
        forwarded one is not ours to keep: its origin's inquiry finds the
        target lacks it and sends it again."""
        body = raw.frame().body
        if not (isinstance(body, Nack) and body.code is ResultCode.OVER_WINDOW):
            return
        ids = self.copies.ids_of(body.lk0, sender)
        b.out.credit[sender] += self.copies.settle(ids, StoredEvent.TARGET_LACKS, sender, b.ts, b.events)
        b.out.over_window[sender] += 1
        if ids:
            b.out.stored_for.add(sender)

    def inquiry(self, b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """An origin asks what became of its documents (RECEIVED), or a
        target about its copies (STATE: answered, and settled: it has them)."""
        body = raw.frame().body
        if not isinstance(body, Inquiry):
            return
        answers: list[InquiryAnswer] = []
        if body.topic is InquiryTopic.RECEIVED:
            asker = route_org(sender)  # (sender: the asking unit's route)
            for lk in body.items:
                if lk.endpoint != asker:
                    # Only a document's origin learns its fate here
                    # (metadata stays between the two parties).
                    answers.append(InquiryAnswer(lk, InquiryResult.NO_RECORD))
                    continue
                answers.append(InquiryAnswer(lk, self.copies.fate(
                    (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id))))
        else:
            for lk in body.items:
                # Only the copy's target asks about it (by its LK1).
                answers.append(InquiryAnswer(lk, state_answer(self.copies.state_of(lk.record_id, sender))))
            b.out.credit[sender] += self.copies.settle([lk.record_id for lk in body.items], StoredEvent.TARGET_ASKS,
                                                       sender, b.ts, b.events)
        b.out.add(sender, Frame(kind=Kind.INQUIRY_RESP, source=self.me, target=route_org(sender),
                                body=InquiryResp(topic=body.topic, answers=tuple(answers),
                                                 flag=InquiryFlag.FROM_PLATFORM)))

    def answers(self, b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """A target's answers to the platform's inquiry: a copy it has is
        settled, one it lacks goes again."""
        body = raw.frame().body
        if not (isinstance(body, InquiryResp) and body.topic is InquiryTopic.RECEIVED):
            return
        got: list[int] = []
        lacks: list[int] = []
        for lk, result in body.answers:
            (got if result is InquiryResult.RECEIVED else lacks).extend(self.copies.ids_of(lk, sender))
        b.out.credit[sender] += self.copies.settle(got, StoredEvent.TARGET_HAS, sender, b.ts, b.events)
        self.copies.settle(lacks, StoredEvent.TARGET_LACKS, sender, b.ts, b.events)
        if lacks:
            b.out.stored_for.add(sender)

    def round(self, ts: int, online: Callable[[Endpoint], bool],
              among: tuple[str, tuple[Any, ...]] | None) -> dict[Endpoint, list[LK0]]:
        """SPEC P.3: the online targets to ask about their copies delivered
        but not acked after the interval (doubling per unanswered inquiry,
        at most 15 min), and about which (counted as asked); ``among``: only
        the targets this instance holds (a subquery of
        semq.platform.cluster.Presence)."""
        groups: dict[Endpoint, list[LK0]] = defaultdict(list)
        asked: list[int] = []
        for c in self.copies.due(ts, self.inquiry_ms, among):
            target = Endpoint(node_type=NodeType(c.target_type), node_id=c.target_id)
            if not online(target):
                continue
            groups[target].append(LK0(endpoint=Endpoint(node_type=NodeType(c.origin_type), node_id=c.origin_id),
                                      semq_id=c.semq_id, semq_db_id=c.semq_db_id, record_id=c.record_id))
            asked.append(c.id)
        self.copies.asked(asked, ts)
        return groups

    def frames(self, groups: dict[Endpoint, list[LK0]]) -> dict[Endpoint, list[bytes]]:
        """A round's INQUIRY frames, per target."""
        sends: dict[Endpoint, list[bytes]] = defaultdict(list)
        for target, lks in groups.items():
            for i in range(0, len(lks), _PER_INQUIRY):
                sends[target].append(encode_frame(Frame(
                    kind=Kind.INQUIRY, source=self.me, target=route_org(target),
                    body=Inquiry(topic=InquiryTopic.RECEIVED, items=tuple(lks[i:i + _PER_INQUIRY]),
                                 flag=InquiryFlag.FROM_PLATFORM))))
        return sends
