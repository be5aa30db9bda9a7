"""A resend is the same message: the messages ``build`` made, kept by
document, so that sending a document again (its receipt lost, a timeout)
posts the very bytes posted before, as AS4's retries do (ebMS3 part 2,
AS4 profile 3.2: reception awareness resends the message, not a new one).

It matters for the receipt: a partner that already has the message answers
its duplicate with the receipt it gave the first time, whose references
are those of the first message's signature. A message built afresh carries
a new timestamp, new ids and a new signature, and that receipt would not
match it. Kept in memory, bounded by bytes (the oldest go first); a
daemon that restarts finds the message in the edge's store (semq.edge.store, ``sent``)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Final

from semq.edge.protocol import EdgePartner, OurKeys, Outgoing

__all__ = ["MAX_KEPT_BYTES", "Resends"]

#: The bytes of built messages kept for resending.
MAX_KEPT_BYTES: Final = 64 * 1024 * 1024


class Resends:
    def __init__(self, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self._max = max_bytes
        self._kept: OrderedDict[bytes, Outgoing] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the sender builds in worker threads

    @staticmethod
    def key(doc_id: str, content: bytes, partner: EdgePartner, ours: OurKeys) -> bytes:
        """The same document, content, partner (as configured now) and keys."""
        h = hashlib.sha256()
        for part in (doc_id.encode(), content, partner.id.encode(), partner.our_id.encode(), partner.their_cert_pem,
                     repr(sorted(partner.options.items())).encode(), ours.cert_pem):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.digest()

    def get(self, key: bytes) -> Outgoing | None:
        with self._lock:
            out = self._kept.get(key)
            if out is not None:
                self._kept.move_to_end(key)
            return out

    def put(self, key: bytes, out: Outgoing) -> None:
        if len(out.body) > self._max:
            return
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= len(old.body)
            self._kept[key] = out
            self._bytes += len(out.body)
            while self._bytes > self._max:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= len(dropped.body)

    def forget(self, message_id: str) -> None:
        """A message confirmed or refused: not sent again."""
        with self._lock:
            for key in [k for k, v in self._kept.items() if v.message_id == message_id]:
                self._bytes -= len(self._kept.pop(key).body)
