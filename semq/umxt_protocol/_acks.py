"""Acknowledgements: ACK, REACK, ACK2, REACK2, ACK_FWD, ACK_SAVE (the
seed's code 810 and its parameters, SPEC "UMX-T frames") and ACK_BATCH, many
acks of one kind in one frame (docs/protocol.md "Acknowledgements, seed code
810" and "ACK_BATCH"; which ack moves which state: SPEC "States" and "The
flow").

The ``Ack``, ``AckEntry`` and ``AckBatch`` values, which ack_flag and flag each
ack kind carries, and their encoders and decoders. A batch of 100,000 entries
is checked over its packed bytes, not entry by entry (``_flags_fit``), on the
way in and on the way out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import partial
from itertools import starmap
from typing import Final, NamedTuple

import semq.umxt_protocol._codec as _codec  # the module: its layouts are bound by assignment below

from ._codec import (
    _ACK_ENTRY_SIZE,
    _NO_APP_KEY,
    _ak,
    _new,
    _read_app_key,
    _slot_setters,
)
from ._errors import RemoteProtocolError, ResultCode
from ._limits import (
    _MAX_U64,
    MAX_ACK_BATCH,
    MAX_RECEIPT,
    _check_bytes,
    _check_int,
    _enum,
)
from ._types import AckFlag, AppKey, ForwardFlag, Kind, _invalid

__all__ = ["Ack", "AckBatch", "AckEntry"]

# Bound by assignment, not imported: see _codec, above its layouts.
_ACK_ENTRY: Final = _codec._ACK_ENTRY
_U8: Final = _codec._U8
_U16: Final = _codec._U16
_U32: Final = _codec._U32


@dataclass(frozen=True, kw_only=True, slots=True)
class Ack:
    """The 810 parameters of ACK, REACK, ACK2, REACK2, ACK_FWD, ACK_SAVE.
    ``src_*``: the record of the side that sends the ack (0 = none);
    ``dest_*``: the record being acked. ``receipt``: on ACK2, the receiver's
    signature over the document's digest (docs/security.md "Receipts (ACK2)")."""

    dest_ref_id: int
    ack_flag: AckFlag
    src_ref_id: int = 0
    src_semq_id: int = 1
    src_semq_db_id: int = 1
    dest_semq_id: int = 1
    dest_semq_db_id: int = 1
    flag: ForwardFlag = ForwardFlag.NONE
    app_key: AppKey = _NO_APP_KEY
    receipt: bytes = b""

    def __post_init__(self) -> None:
        if self.ack_flag.__class__ is not AckFlag:
            object.__setattr__(self, "ack_flag", _enum(AckFlag, "ack_flag", self.ack_flag))
        if self.flag.__class__ is not ForwardFlag:
            object.__setattr__(self, "flag", _enum(ForwardFlag, "flag", self.flag))
        a, b, c = self.src_semq_id, self.src_semq_db_id, self.src_ref_id
        d, e, f = self.dest_semq_id, self.dest_semq_db_id, self.dest_ref_id
        # One fused comparison on the hot path; the named checks word the error.
        if not (
            type(a) is int and type(b) is int and type(c) is int
            and type(d) is int and type(e) is int and type(f) is int
            and 0 <= a <= 0xFFFF and 0 <= b <= 0xFFFF and 0 <= c <= _MAX_U64
            and 0 <= d <= 0xFFFF and 0 <= e <= 0xFFFF and 0 <= f <= _MAX_U64
        ):
            _check_int("src_semq_id", a, 0, 0xFFFF)
            _check_int("src_semq_db_id", b, 0, 0xFFFF)
            _check_int("src_ref_id", c, 0, _MAX_U64)
            _check_int("dest_semq_id", d, 0, 0xFFFF)
            _check_int("dest_semq_db_id", e, 0, 0xFFFF)
            _check_int("dest_ref_id", f, 0, _MAX_U64)
        r = self.receipt
        if type(r) is not bytes or len(r) > MAX_RECEIPT:
            _check_bytes("receipt", r, MAX_RECEIPT)

    @property
    def entry(self) -> AckEntry:
        return AckEntry(
            self.src_semq_id,
            self.src_semq_db_id,
            self.src_ref_id,
            self.dest_semq_id,
            self.dest_semq_db_id,
            self.dest_ref_id,
            int(self.ack_flag),
            int(self.flag),
        )


class AckEntry(NamedTuple):
    """One ack in an ACK_BATCH: the 810 parameters without AppKey (the
    receiving side looks it up by dest_ref_id). Plain ints for speed."""

    src_semq_id: int
    src_semq_db_id: int
    src_ref_id: int
    dest_semq_id: int
    dest_semq_db_id: int
    dest_ref_id: int
    ack_flag: int
    flag: int = 0

    @classmethod
    def of(
        cls,
        dest_ref_id: int,
        ack_flag: AckFlag,
        *,
        src_ref_id: int = 0,
        flag: ForwardFlag = ForwardFlag.NONE,
        src_semq_id: int = 1,
        src_semq_db_id: int = 1,
        dest_semq_id: int = 1,
        dest_semq_db_id: int = 1,
    ) -> AckEntry:
        return cls(
            src_semq_id, src_semq_db_id, src_ref_id, dest_semq_id, dest_semq_db_id,
            dest_ref_id, int(ack_flag), int(flag),
        )


# Which ack_flag / flag each ack kind must carry (SPEC: ack_flag 1 platform hop,
# 2 delivery; flag 1 forwarded / 2 stored only on ACK_FWD / ACK_SAVE).
_ACK_RULES: Final[dict[Kind, tuple[AckFlag, ForwardFlag]]] = {
    Kind.ACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.REACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.ACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.REACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.ACK_FWD: (AckFlag.PLATFORM, ForwardFlag.FORWARDED),
    Kind.ACK_SAVE: (AckFlag.PLATFORM, ForwardFlag.STORED),
}


def _flags_fit(packed: bytes, n: int, ack_flag: int, flag: int) -> bool:
    """Whether every one of the ``n`` packed ack entries (26 bytes each) has
    ``ack_flag`` and ``flag``: their two flag bytes sit at offsets 24 and 25,
    so the check counts bytes in two strided slices instead of looping."""
    return packed[24::_ACK_ENTRY.size].count(ack_flag) == n and packed[25::_ACK_ENTRY.size].count(flag) == n


@dataclass(frozen=True, kw_only=True, slots=True)
class AckBatch:
    """Many acks of one kind in one frame (kind ACK_BATCH). ``receipt`` may
    carry one signature over the whole batch (a batch receipt)."""

    ack_kind: Kind
    entries: tuple[AckEntry, ...]
    receipt: bytes = b""
    # The entries as the wire carries them (26 bytes each), made while
    # checking them; the encoder sends these bytes. Not part of the value.
    _packed: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _enum(Kind, "ack_kind", self.ack_kind)
        if kind not in _ACK_RULES:
            raise _invalid(f"ack_kind {kind.name} is not an ack kind")
        object.__setattr__(self, "ack_kind", kind)
        if not isinstance(self.entries, tuple):
            object.__setattr__(self, "entries", tuple(AckEntry(*e) for e in self.entries))
        n = len(self.entries)
        if n > MAX_ACK_BATCH:
            raise _invalid(
                f"ACK_BATCH of {n} entries exceeds the {MAX_ACK_BATCH} limit"
            )
        ack_flag, flag = _ACK_RULES[kind]
        # Packing checks every id's range and type (struct refuses the rest);
        # the two flag bytes of every entry are then counted in the packed
        # bytes (offsets 24 and 25 of 26), as the decoder does. Only a batch
        # that fails is checked entry by entry, to say what is wrong.
        try:
            packed: bytes | None = b"".join(starmap(_ACK_ENTRY.pack, self.entries))
        except struct.error:
            packed = None
        if packed is not None and _flags_fit(packed, n, ack_flag, flag):
            object.__setattr__(self, "_packed", packed)
        else:
            self._check_entries(kind, ack_flag, flag)
        _check_bytes("receipt", self.receipt, MAX_RECEIPT)

    def _check_entries(self, kind: Kind, ack_flag: int, flag: int) -> None:
        for e in self.entries:
            if e[6] != ack_flag or e[7] != flag:
                raise _invalid(
                    f"ACK_BATCH of {kind.name} holds an entry with ack_flag {e[6]} flag {e[7]};"
                    f" {kind.name} needs ack_flag {int(ack_flag)} flag {int(flag)}"
                )
            # One chained comparison per field: cheap enough for 100k entries,
            # and it keeps out-of-range ints from reaching struct.pack later.
            try:
                ok = (
                    0 <= e[0] <= 0xFFFF and 0 <= e[1] <= 0xFFFF and 0 <= e[2] <= _MAX_U64
                    and 0 <= e[3] <= 0xFFFF and 0 <= e[4] <= 0xFFFF and 0 <= e[5] <= _MAX_U64
                )
            except TypeError:  # not an int: _check_int names it
                ok = False
            if not ok:
                for i, name in enumerate(AckEntry._fields[:6]):
                    _check_int(f"ACK_BATCH entry {name}", e[i], 0, _MAX_U64 if i in (2, 5) else 0xFFFF)


def _encode_ack(a: Ack) -> bytes:
    return b"".join(
        (_ACK_ENTRY.pack(*a.entry), _ak(a.app_key), _U16.pack(len(a.receipt)), a.receipt)
    )


def _encode_ack_batch(b: AckBatch) -> bytes:
    packed = b._packed
    return b"".join(
        (
            _U8.pack(b.ack_kind),
            _U32.pack(len(b.entries)),
            packed if packed is not None else b"".join(starmap(_ACK_ENTRY.pack, b.entries)),
            _U16.pack(len(b.receipt)),
            b.receipt,
        )
    )


_ACK_SET: Final = _slot_setters(
    Ack, "dest_ref_id", "ack_flag", "src_ref_id", "src_semq_id", "src_semq_db_id",
    "dest_semq_id", "dest_semq_db_id", "flag", "app_key", "receipt",
)
_BATCH_SET: Final = _slot_setters(AckBatch, "ack_kind", "entries", "receipt", "_packed")
_ACK_FLAG_OF: Final = {int(f): f for f in AckFlag}
_FWD_FLAG_OF: Final = {int(f): f for f in ForwardFlag}
_ACK_KIND_OF: Final = {int(k): k for k in _ACK_RULES}
_make_entry: Final = partial(tuple.__new__, AckEntry)  # AckEntry._make without the Python frame


def _decode_ack(kind: Kind, buf: bytes) -> Ack:
    e = _ACK_ENTRY.unpack_from(buf)
    app_key, pos = _read_app_key(buf, _ACK_ENTRY_SIZE)
    (r_len,) = _U16.unpack_from(buf, pos)
    if pos + 2 + r_len != len(buf):
        raise RemoteProtocolError(f"{kind.name} body length is inconsistent", ResultCode.MALFORMED_FRAME)
    receipt = buf[pos + 2 :]
    ack_flag = _ACK_FLAG_OF.get(e[6])
    flag = _FWD_FLAG_OF.get(e[7])
    # The ids are unsigned and in range by layout (Ack allows 0 = none); left
    # open: the two flags' values and the receipt's size.
    if ack_flag is None or flag is None or r_len > MAX_RECEIPT:
        return Ack(src_semq_id=e[0], src_semq_db_id=e[1], src_ref_id=e[2],  # raises
                   dest_semq_id=e[3], dest_semq_db_id=e[4], dest_ref_id=e[5],
                   ack_flag=e[6], flag=e[7], app_key=app_key, receipt=receipt)
    a = _new(Ack)
    s = _ACK_SET
    s[0](a, e[5])
    s[1](a, ack_flag)
    s[2](a, e[2])
    s[3](a, e[0])
    s[4](a, e[1])
    s[5](a, e[3])
    s[6](a, e[4])
    s[7](a, flag)
    s[8](a, app_key)
    s[9](a, receipt)
    return a


def _decode_ack_batch(buf: bytes) -> AckBatch:
    if len(buf) < 7:
        raise RemoteProtocolError("ACK_BATCH body is too short", ResultCode.MALFORMED_FRAME)
    (count,) = _U32.unpack_from(buf, 1)
    end = 5 + count * _ACK_ENTRY_SIZE
    if end + 2 > len(buf):
        raise RemoteProtocolError(
            f"ACK_BATCH declares {count} entries but the body holds {len(buf)} bytes",
            ResultCode.MALFORMED_FRAME,
        )
    (r_len,) = _U16.unpack_from(buf, end)
    if end + 2 + r_len != len(buf):
        raise RemoteProtocolError("ACK_BATCH has bytes after its receipt", ResultCode.MALFORMED_FRAME)
    kind = _ACK_KIND_OF.get(buf[0])
    packed = buf[5:end]
    entries = tuple(map(_make_entry, _ACK_ENTRY.iter_unpack(packed)))
    receipt = buf[end + 2 :]
    if kind is not None and count <= MAX_ACK_BATCH and r_len <= MAX_RECEIPT:
        # The kind's flags checked over the packed bytes, as AckBatch does.
        ack_flag, flag = _ACK_RULES[kind]
        if _flags_fit(packed, count, ack_flag, flag):
            batch = _new(AckBatch)
            s = _BATCH_SET
            s[0](batch, kind)
            s[1](batch, entries)
            s[2](batch, receipt)
            s[3](batch, packed)
            return batch
    return AckBatch(ack_kind=buf[0], entries=entries, receipt=receipt)  # type: ignore[arg-type]  # raises

