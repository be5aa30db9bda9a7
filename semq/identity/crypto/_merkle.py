"""Merkle trees (RFC 9162 section 2.1: leaf = SHA-256(0x00 || data), node =
SHA-256(0x01 || left || right), the left subtree holding the largest power of
two below n leaves). One signature over a root covers a batch; an inclusion
path of ceil(log2 n) hashes proves one member. Used by batch document
signatures and batch receipts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

__all__ = ["HASH_SIZE", "MerkleTree", "leaf_hash", "root_from_path"]

HASH_SIZE: Final = 32


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


# Memo of inner nodes for root_from_path: the documents of one signed batch
# share their upper nodes, so a receiver checking n paths of ~log2(n) hashes
# computes each inner node once instead of up to n/2 times. Keyed on the
# exact 64 input bytes (left || right) -> SHA-256(0x01 || left || right): a
# pure function's memo, so nothing an attacker sends can make it answer
# differently from computing. Bounded: cleared at _MEMO_MAX entries.
_MEMO_MAX: Final = 1 << 14  # ~3 MB
_memo: dict[bytes, bytes] = {}


class MerkleTree:
    """A tree over ``leaves`` (already leaf-hashed). Built level by level; an
    odd node at the end of a level moves up unchanged, which yields exactly
    the RFC 9162 tree. ``root`` and ``path(i)`` in O(n) build, O(log n) each."""

    __slots__ = ("levels",)

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        level = list(leaves)
        self.levels = [level]
        sha256 = hashlib.sha256
        while len(level) > 1:
            nxt = [sha256(b"\x01" + level[i] + level[i + 1]).digest()
                   for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            self.levels.append(nxt)
            level = nxt

    @property
    def size(self) -> int:
        return len(self.levels[0])

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def path(self, index: int) -> list[bytes]:
        """The inclusion path of leaf ``index``, bottom up."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} is outside 0..{self.size - 1}")
        out = []
        i = index
        for level in self.levels:
            sibling = i ^ 1
            if sibling < len(level):
                out.append(level[sibling])
            i >>= 1
        return out

    def joined_paths(self) -> list[bytes]:
        """``b"".join(self.path(i))`` for every leaf i, in order (the path
        length is ``len(...) // HASH_SIZE``). Leaves of one subtree share the
        upper part of their paths, so this builds each shared suffix once."""
        suffixes = [b""]
        for level in reversed(self.levels[:-1]):
            n = len(level)
            suffixes = [(level[j ^ 1] if j ^ 1 < n else b"") + suffixes[j >> 1]
                         for j in range(n)]
        return suffixes


def root_from_path(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes:
    """The root implied by ``leaf`` at ``index`` of ``size`` leaves with
    inclusion ``path`` (RFC 9162 2.1.3.2). Raises ValueError if the path has
    the wrong length for that position; the caller compares the root."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is outside 0..{size - 1}")
    memo = _memo
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    fn, sn, r = index, size - 1, bytes(leaf)
    for p in path:
        if sn == 0:
            raise ValueError(f"inclusion path of {len(path)} hashes is too long")
        if type(p) is not bytes:
            p = bytes(p)  # bytearray or memoryview: the memo needs hashable keys
        if fn & 1 or fn == sn:
            key = p + r
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            key = r + p
        h = memo.get(key)
        if h is None:
            h = memo[key] = hashlib.sha256(b"\x01" + key).digest()
        r = h
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError(f"inclusion path of {len(path)} hashes is too short")
    return r
