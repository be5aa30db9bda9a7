"""Each organization's storage quota at the platform (``quota_mib``;
docs/design.md, "Flow control"): bytes of its documents and kept chunks
stored here at once. A DATA to store past it is refused QUOTA_EXCEEDED (its
origin keeps it and sends it again later); a chunk past it is not kept.

Owns no table: what an organization stores is ``StoredCopies.bytes_of``
(semq.platform.copies). Held in memory, per organization, an upper bound
of its stored bytes and when it was counted: counted from the table when a
document would take it over the quota and the count is older than
_RECOUNT_S, and raised by every document stored since. Deletions only
lower the truth, so the bound never lets an organization past its quota,
and an organization far below it is never counted again."""

from __future__ import annotations

import time
from typing import Final

from .copies import StoredCopies

__all__ = ["Quota"]

_RECOUNT_S: Final = 2.0  # how often an organization at its quota is counted again


class Quota:
    """The quota of every organization: ``limit`` bytes (0: none; the
    operator's reload changes it)."""

    def __init__(self, copies: StoredCopies, limit: int) -> None:
        self.copies = copies
        self.limit = limit
        # (origin_type, origin_id) -> [an upper bound of its stored bytes,
        # when it was counted (monotonic s)]
        self._usage: dict[tuple[int, str], list[float]] = {}

    def allows(self, origin_type: int, origin_id: str, size: int) -> bool:
        """Whether ``size`` more bytes of ``origin_id``'s documents fit its
        quota (and count them if so). Inside the caller's transaction."""
        key = (origin_type, origin_id)
        u = self._usage.get(key)
        now = time.monotonic()
        if u is None or (u[0] + size > self.limit and now - u[1] >= _RECOUNT_S):
            u = self._usage[key] = [self.copies.bytes_of(origin_type, origin_id), now]
        if u[0] + size > self.limit:
            return False
        u[0] += size
        return True
