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
        while len(level) > 1:
            nxt = [_node(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
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
        for level in self.levels[:-1]:
            sibling = i ^ 1
            if sibling < len(level):
                out.append(level[sibling])
            i >>= 1
        return out


def root_from_path(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes:
    """The root implied by ``leaf`` at ``index`` of ``size`` leaves with
    inclusion ``path`` (RFC 9162 2.1.3.2). Raises ValueError if the path has
    the wrong length for that position; the caller compares the root."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is outside 0..{size - 1}")
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            raise ValueError(f"inclusion path of {len(path)} hashes is too long")
        if fn & 1 or fn == sn:
            r = _node(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError(f"inclusion path of {len(path)} hashes is too short")
    return r
