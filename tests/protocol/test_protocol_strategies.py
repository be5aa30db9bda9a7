"""Hypothesis strategies for every UMX-T value, shared by the protocol tests.

The other tests/test_protocol_*.py modules import this one as
``tests.protocol.test_protocol_strategies`` (tests/ is a package). The tests at the end of
this file check the strategies themselves: that they reach every kind and the
edges of every range, so a narrowed strategy cannot make the round-trip tests
pass vacuously.

Strategies cover the full range of every field: node ids of 1..64 characters
of [A-Za-z0-9._:@-], AppKey parts up to exactly 255 UTF-8 bytes, u16/u64
bounds, priorities 0..9, the SaveFwd / Reliable=0 / Ack2 rules, Encrypt with a
session key, LK1 and expiry absent or set, the envelope, ordered and
large-document flags, ACK_BATCH entries consistent with their ack kind,
inquiries and certificates, a large document's chunks (index and flags at
their bounds, payloads empty to a few KiB) and their acknowledgements,
direct-link announcements and their addresses (1..255 printable UTF-8
bytes, up to MAX_PEER_ADDRESSES).
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from semq.umxt_protocol import (
    CHUNK_COMPRESSED,
    LK0,
    LK1,
    MAX_APPKEY_FIELD,
    MAX_NODE_ID,
    MAX_PRIORITY,
    MAX_SESSION_KEY,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Body,
    Bye,
    CertRequest,
    CertResponse,
    Chunk,
    ChunkAck,
    Crl,
    Data,
    Endpoint,
    Error,
    ForwardFlag,
    Frame,
    Hello,
    Inquiry,
    InquiryAnswer,
    InquiryFlag,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    NodeType,
    PeerAnnounce,
    PeerInfo,
    PeerLookup,
    Ping,
    Pong,
    Presence,
    PresenceEntry,
    PresenceQuery,
    PresenceState,
    ResultCode,
    SaveFwd,
    Welcome,
    WindowUpdate,
)
from semq.umxt_protocol._limits import MAX_PEER_ADDRESSES, MAX_PEER_TTL, MAX_PRESENCE_ITEMS

# Deterministic and bounded (STYLE: "Tests MUST pass deterministically"): a
# fixed derandomized search, no example database, no per-example deadline
# (the CI machine is 2 slow shared cores).
PROTOCOL_SETTINGS: Final = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The decoder fuzz tests are cheap per example and look for rare byte
# patterns: give them more examples.
FUZZ_SETTINGS: Final = settings(PROTOCOL_SETTINGS, max_examples=400)

U16: Final = 0xFFFF
U32: Final = 0xFFFF_FFFF
U64: Final = 0xFFFF_FFFF_FFFF_FFFF
MAX_MS: Final = 0x7FFF_FFFF_FFFF_FFFF  # times are ms since the epoch, signed-safe
MAX_RECEIPT: Final = 4096
MAX_TEXT: Final = 1024
MAX_TOKEN: Final = 4096

NODE_ID_ALPHABET: Final = string.ascii_letters + string.digits + "._:@-"

ACK_RULES: Final[dict[Kind, tuple[AckFlag, ForwardFlag]]] = {
    Kind.ACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.REACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.ACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.REACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.ACK_FWD: (AckFlag.PLATFORM, ForwardFlag.FORWARDED),
    Kind.ACK_SAVE: (AckFlag.PLATFORM, ForwardFlag.STORED),
}
ACK_KINDS: Final = tuple(ACK_RULES)
SESSION_KINDS: Final = tuple(k for k in Kind if not k.is_message)


def edgy_int(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in low..high that hit both bounds often (the bugs live there)."""
    return st.one_of(st.sampled_from([low, high, min(low + 1, high), max(high - 1, low)]),
                     st.integers(low, high))


def _cut_utf8(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 form fits ``limit`` bytes."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


node_ids = st.one_of(
    st.text(NODE_ID_ALPHABET, min_size=1, max_size=MAX_NODE_ID),
    st.text(NODE_ID_ALPHABET, min_size=MAX_NODE_ID, max_size=MAX_NODE_ID),
)
node_types = st.sampled_from(list(NodeType))
endpoints = st.builds(Endpoint, node_type=node_types, node_id=node_ids)
semq_ids = edgy_int(1, U16)
record_ids = edgy_int(1, U64)

# Any Unicode text (hypothesis leaves out surrogates), cut to the byte limit;
# plus parts of exactly 255 bytes, ASCII and multi-byte.
appkey_parts = st.one_of(
    st.just(""),
    st.text(max_size=40),
    st.text(max_size=MAX_APPKEY_FIELD).map(lambda s: _cut_utf8(s, MAX_APPKEY_FIELD)),
    st.just("x" * MAX_APPKEY_FIELD),
    st.just("é" * 127 + "x"),  # 255 bytes of two-byte characters and one ASCII
)
app_keys = st.builds(AppKey, domain=appkey_parts, data_type=appkey_parts,
                     subtype=appkey_parts, key=appkey_parts)


@st.composite
def lk0s(draw: st.DrawFn, endpoint: Endpoint | None = None) -> LK0:
    return LK0(
        endpoint=endpoint if endpoint is not None else draw(endpoints),
        semq_id=draw(semq_ids),
        semq_db_id=draw(semq_ids),
        record_id=draw(record_ids),
    )


lk1s = st.builds(LK1, semq_id=semq_ids, semq_db_id=semq_ids, record_id=record_ids)
times_ms = edgy_int(0, MAX_MS)
expiries = st.one_of(st.none(), edgy_int(1, MAX_MS))
texts = st.one_of(st.text(max_size=60), st.text(max_size=MAX_TEXT))
priorities = st.integers(0, MAX_PRIORITY)


@st.composite
def data_bodies(draw: st.DrawFn, origin: Endpoint | None = None) -> Data:
    encrypt = draw(st.booleans())
    session_key = (
        draw(st.one_of(st.binary(min_size=1, max_size=64),
                       st.binary(min_size=MAX_SESSION_KEY, max_size=MAX_SESSION_KEY)))
        if encrypt
        else b""
    )
    key_sealed = encrypt and draw(st.booleans())  # the AppKey inside the sealed AppData
    envelope = draw(st.booleans())
    ordered = envelope and draw(st.booleans())  # an ordered channel is named in the envelope
    return Data(
        lk0=draw(lk0s(origin)),
        app_data=draw(st.one_of(st.binary(max_size=64), st.binary(max_size=4096))),
        app_key=AppKey() if key_sealed else draw(app_keys),
        key_sealed=key_sealed,
        lk1=draw(st.one_of(st.none(), lk1s)),
        created_ms=draw(times_ms),
        expires_ms=draw(expiries),
        encrypt=encrypt,
        session_key=session_key,
        envelope=envelope,
        ordered=ordered,
        large=draw(st.booleans()),  # AppData is a large document's manifest
    )


receipts = st.one_of(st.just(b""), st.binary(max_size=128),
                     st.binary(min_size=MAX_RECEIPT, max_size=MAX_RECEIPT))


@st.composite
def ack_entries(draw: st.DrawFn, kind: Kind) -> AckEntry:
    ack_flag, flag = ACK_RULES[kind]
    return AckEntry(
        src_semq_id=draw(edgy_int(0, U16)),
        src_semq_db_id=draw(edgy_int(0, U16)),
        src_ref_id=draw(edgy_int(0, U64)),
        dest_semq_id=draw(edgy_int(0, U16)),
        dest_semq_db_id=draw(edgy_int(0, U16)),
        dest_ref_id=draw(edgy_int(0, U64)),
        ack_flag=int(ack_flag),
        flag=int(flag),
    )


@st.composite
def ack_bodies(draw: st.DrawFn, kind: Kind) -> Ack:
    e = draw(ack_entries(kind))
    return Ack(
        src_semq_id=e.src_semq_id, src_semq_db_id=e.src_semq_db_id, src_ref_id=e.src_ref_id,
        dest_semq_id=e.dest_semq_id, dest_semq_db_id=e.dest_semq_db_id,
        dest_ref_id=e.dest_ref_id, ack_flag=AckFlag(e.ack_flag), flag=ForwardFlag(e.flag),
        app_key=draw(app_keys), receipt=draw(receipts),
    )


@st.composite
def ack_batch_bodies(draw: st.DrawFn, max_entries: int = 40) -> AckBatch:
    kind = draw(st.sampled_from(ACK_KINDS))
    entries = draw(st.lists(ack_entries(kind), max_size=max_entries))
    return AckBatch(ack_kind=kind, entries=tuple(entries), receipt=draw(receipts))


inquiry_bodies = st.builds(
    Inquiry,
    topic=st.sampled_from(list(InquiryTopic)),
    items=st.lists(lk0s(), min_size=1, max_size=8).map(tuple),
    flag=st.sampled_from(list(InquiryFlag)),
)
inquiry_resp_bodies = st.builds(
    InquiryResp,
    topic=st.sampled_from(list(InquiryTopic)),
    answers=st.lists(
        st.builds(InquiryAnswer, lk0s(), st.sampled_from(list(InquiryResult))),
        min_size=1, max_size=8,
    ).map(tuple),
    flag=st.sampled_from(list(InquiryFlag)),
)
result_codes = st.sampled_from(list(ResultCode))
nack_bodies = st.builds(Nack, lk0=lk0s(), code=result_codes, message=texts,
                        proof=st.one_of(st.just(b""), st.binary(max_size=200)))
chunk_payloads = st.one_of(st.just(b""), st.binary(max_size=64), st.binary(min_size=1024, max_size=4096))


@st.composite
def chunk_bodies(draw: st.DrawFn, origin: Endpoint | None = None) -> Chunk:
    """A chunk of a document of ``origin`` (a CHUNK's LK0 is its origin's)."""
    return Chunk(lk0=draw(lk0s(origin)), index=draw(edgy_int(0, U32)),
                 flags=draw(st.sampled_from([0, CHUNK_COMPRESSED])), payload=draw(chunk_payloads))


# Mostly OK (chunks committed), and every refusal's code.
chunk_ack_bodies = st.builds(ChunkAck, lk0=lk0s(), through=edgy_int(0, U32),
                             code=st.one_of(st.just(ResultCode.OK), result_codes), message=texts)
hello_bodies = semq_ids.flatmap(lambda unit: st.builds(
    Hello,
    semq_id=st.just(unit),
    semq_db_id=semq_ids,
    window=edgy_int(1, U32),
    software=st.text(max_size=255).map(lambda s: _cut_utf8(s, 255)),
    token=st.one_of(st.binary(max_size=64), st.binary(min_size=MAX_TOKEN, max_size=MAX_TOKEN)),
    units=edgy_int(unit, 0xFFFF),  # a unit is one of the node's units
))
welcome_bodies = st.builds(Welcome, window=edgy_int(1, U32), server_time_ms=times_ms,
                           session_id=edgy_int(0, U64))
ping_bodies = st.builds(Ping, nonce=edgy_int(0, U64), time_ms=times_ms)
pong_bodies = st.builds(Pong, nonce=edgy_int(0, U64), time_ms=times_ms)
error_bodies = st.builds(Error, code=result_codes, message=texts)
window_bodies = st.builds(WindowUpdate, credit=edgy_int(0, U32))
cert_request_bodies = st.builds(CertRequest, endpoint=endpoints)
cert_response_bodies = st.builds(
    CertResponse,
    endpoint=endpoints,
    code=result_codes,
    certificates=st.lists(st.binary(max_size=300), max_size=8).map(tuple),
)
bye_bodies = st.builds(Bye, code=result_codes, reason=texts)
crl_bodies = st.builds(Crl, der=st.binary(min_size=1, max_size=600))

MAX_ADDRESS: Final = 255  # bytes of one direct-link address


def _printable_address(text: str) -> str:
    """``text`` as an address: printable characters only, cut to 255 UTF-8
    bytes, never empty."""
    return _cut_utf8("".join(c for c in text if c.isprintable()), MAX_ADDRESS) or "h:1"


# HOST:PORT as nodes announce them, any printable text (the protocol does not
# check the form), and addresses of exactly 255 bytes, ASCII and multi-byte.
peer_addresses = st.one_of(
    st.sampled_from(["203.0.113.7:7443", "[2001:db8::7]:7443", "node-a.example:443", "h:1"]),
    st.text(min_size=1, max_size=40).map(_printable_address),
    st.text(min_size=1, max_size=MAX_ADDRESS).map(_printable_address),
    st.just("h" * (MAX_ADDRESS - 6) + ":65535"),
    st.just("é" * 125 + ":4433"),  # 250 bytes of two-byte characters and 5 ASCII
)
peer_address_lists = st.one_of(
    st.lists(peer_addresses, max_size=3),
    st.lists(peer_addresses, min_size=MAX_PEER_ADDRESSES, max_size=MAX_PEER_ADDRESSES),
).map(tuple)
fingerprints = st.one_of(
    st.just(""),
    st.binary(min_size=32, max_size=32).map(bytes.hex),  # SHA-256, hex
    st.text(st.characters(max_codepoint=127), max_size=255),
)
peer_announce_bodies = st.builds(
    PeerAnnounce,
    ttl_s=edgy_int(0, MAX_PEER_TTL),
    addresses=peer_address_lists,
    observe=st.booleans(),
    allowed=st.lists(node_ids, max_size=8).map(tuple),
)
peer_lookup_bodies = st.builds(PeerLookup, endpoint=endpoints)
peer_info_bodies = st.builds(
    PeerInfo,
    endpoint=endpoints,
    code=result_codes,
    expires_ms=times_ms,
    fingerprint=fingerprints,
    addresses=peer_address_lists,
)
presence_query_bodies = st.builds(
    PresenceQuery,
    orgs=st.one_of(st.lists(node_ids, min_size=1, max_size=4),
                   st.lists(node_ids, min_size=MAX_PRESENCE_ITEMS, max_size=MAX_PRESENCE_ITEMS)).map(tuple),
)
presence_entries = st.builds(PresenceEntry, node_ids, st.sampled_from(list(PresenceState)), times_ms, times_ms)
presence_bodies = st.builds(
    Presence,
    entries=st.one_of(st.lists(presence_entries, min_size=1, max_size=4),
                      st.lists(presence_entries, min_size=MAX_PRESENCE_ITEMS, max_size=MAX_PRESENCE_ITEMS)).map(tuple),
)

SESSION_BODIES: Final[dict[Kind, st.SearchStrategy[Any]]] = {
    Kind.HELLO: hello_bodies,
    Kind.WELCOME: welcome_bodies,
    Kind.PING: ping_bodies,
    Kind.PONG: pong_bodies,
    Kind.ERROR: error_bodies,
    Kind.WINDOW: window_bodies,
    Kind.CERT_REQUEST: cert_request_bodies,
    Kind.CERT_RESPONSE: cert_response_bodies,
    Kind.BYE: bye_bodies,
    Kind.CRL: crl_bodies,
    Kind.PEER_ANNOUNCE: peer_announce_bodies,
    Kind.PEER_LOOKUP: peer_lookup_bodies,
    Kind.PEER_INFO: peer_info_bodies,
    Kind.PRESENCE_QUERY: presence_query_bodies,
    Kind.PRESENCE: presence_bodies,
}


@st.composite
def frames_of(draw: st.DrawFn, kind: Kind) -> Frame:
    """A valid Frame of ``kind`` with every header attribute drawn within the
    rules the SPEC sets for that kind."""
    source = draw(endpoints)
    target = draw(endpoints)
    priority = draw(priorities)
    if kind is Kind.DATA:
        origin = draw(st.one_of(st.just(source), endpoints))
        body: Body = draw(data_bodies(origin))
        reliable = draw(st.booleans())
        if reliable:
            save_fwd = draw(st.sampled_from([SaveFwd.DISCARD, SaveFwd.STORE, SaveFwd.MUST_DELIVER]))
            ack2 = draw(st.booleans())
        else:  # best effort: never stored, never acked (SPEC "UMX-T frames")
            save_fwd, ack2 = SaveFwd.DISCARD, False
        return Frame(kind=kind, source=source, target=target, origin=origin, body=body,
                     reliable=reliable, save_fwd=save_fwd, ack2=ack2, priority=priority)
    origin = draw(st.one_of(st.just(source), endpoints))
    if kind.is_message:
        if kind in ACK_RULES:
            body = draw(ack_bodies(kind))
        elif kind is Kind.ACK_BATCH:
            body = draw(ack_batch_bodies())
        elif kind is Kind.INQUIRY:
            body = draw(inquiry_bodies)
        elif kind is Kind.INQUIRY_RESP:
            body = draw(inquiry_resp_bodies)
        elif kind is Kind.CHUNK:
            body = draw(chunk_bodies(origin))
        elif kind is Kind.CHUNK_ACK:
            body = draw(chunk_ack_bodies)
        else:
            assert kind is Kind.NACK, kind
            body = draw(nack_bodies)
        # Acks, inquiries, NACKs and chunks travel Reliable=1, SaveFwd=3, Ack2=0.
        return Frame(kind=kind, source=source, target=target, origin=origin, body=body,
                     save_fwd=SaveFwd.MUST_DELIVER, priority=priority)
    body = draw(SESSION_BODIES[kind])
    return Frame(kind=kind, source=source, target=target, origin=origin, body=body,
                 reliable=draw(st.booleans()), priority=priority)


kinds = st.sampled_from(list(Kind))
frames = kinds.flatmap(frames_of)


# ------------------------------------------------------- shared assertions


def _typed(value: Any) -> Any:
    """``value`` as nested (type, content) pairs, so that comparing two of
    them also compares types (an IntEnum equals its int; a bool equals 1)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple((f.name, _typed(getattr(value, f.name)))
                                   for f in dataclasses.fields(value)))
    if isinstance(value, tuple):
        return (type(value), tuple(_typed(v) for v in value))
    return (type(value), value)


def _rebuild(value: Any) -> Any:
    """``value`` rebuilt bottom-up through the public constructors (which
    validate in __post_init__)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kwargs = {f.name: _rebuild(getattr(value, f.name))
                  for f in dataclasses.fields(value) if f.init}
        return type(value)(**kwargs)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # NamedTuple
        return type(value)(*(_rebuild(v) for v in value))
    if isinstance(value, tuple):
        return tuple(_rebuild(v) for v in value)
    return value


def assert_valid_value(frame: Frame) -> None:
    """The decoder builds values without their dataclass __init__ (for speed);
    whatever it returns must be exactly what the validating public
    constructors build from the same fields, types included."""
    rebuilt = _rebuild(frame)  # raises LocalProtocolError if anything is invalid
    assert _typed(rebuilt) == _typed(frame)


# ------------------------------------------------- checks on the strategies


def test_every_kind_has_a_strategy() -> None:
    """A new Kind without a strategy would silently escape the round trips."""
    others = (Kind.ACK_BATCH, Kind.INQUIRY, Kind.INQUIRY_RESP, Kind.NACK, Kind.CHUNK, Kind.CHUNK_ACK)
    for kind in Kind:
        assert kind is Kind.DATA or kind in ACK_RULES or kind in SESSION_BODIES or kind in others
    assert set(ACK_RULES) | {Kind.DATA, *others} | set(SESSION_BODIES) == set(Kind)


class _Found(Exception):
    pass


def _reaches(strategy: st.SearchStrategy[Any], predicate: Any) -> None:
    """``strategy`` can produce a value satisfying ``predicate``. Generation
    only (no shrinking): we stop at the first hit."""

    @settings(derandomize=True, database=None, deadline=None, max_examples=400,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def search(value: Any) -> None:
        if predicate(value):
            raise _Found

    try:
        search()
    except _Found:
        return
    raise AssertionError("the strategy never produced a value at the edge")


def test_strategies_reach_the_edges() -> None:
    _reaches(node_ids, lambda s: len(s) == MAX_NODE_ID)
    _reaches(node_ids, lambda s: len(s) == 1)
    _reaches(appkey_parts, lambda s: len(s.encode()) == MAX_APPKEY_FIELD)
    _reaches(appkey_parts, lambda s: len(s.encode()) > len(s))  # multi-byte characters
    _reaches(record_ids, lambda r: r == U64)
    _reaches(semq_ids, lambda r: r == U16)
    _reaches(expiries, lambda e: e is None)
    _reaches(frames_of(Kind.DATA), lambda f: f.body.lk1 is not None and f.body.encrypt
             and f.ack2 and f.body.expires_ms is not None)
    _reaches(frames_of(Kind.DATA), lambda f: not f.reliable)
    _reaches(frames_of(Kind.DATA), lambda f: f.priority == MAX_PRIORITY)
    _reaches(frames_of(Kind.DATA), lambda f: f.body.large and f.body.encrypt and f.body.ordered)
    _reaches(frames_of(Kind.DATA), lambda f: not f.body.large)
    _reaches(frames_of(Kind.CHUNK), lambda f: f.body.index == U32 and f.body.flags == CHUNK_COMPRESSED)
    _reaches(frames_of(Kind.CHUNK), lambda f: f.body.index == 0 and not f.body.payload)
    _reaches(frames_of(Kind.CHUNK), lambda f: len(f.body.payload) > 1024 and f.origin != f.source)
    _reaches(chunk_ack_bodies, lambda b: b.through == U32 and b.code is ResultCode.OK)
    _reaches(chunk_ack_bodies, lambda b: b.through == 0 and b.code is not ResultCode.OK and b.message)
    _reaches(ack_batch_bodies(), lambda b: not b.entries)
    _reaches(ack_batch_bodies(), lambda b: len(b.entries) > 5)
    _reaches(peer_addresses, lambda a: len(a.encode()) == MAX_ADDRESS)
    _reaches(peer_addresses, lambda a: len(a.encode()) > len(a))  # multi-byte characters
    _reaches(peer_announce_bodies, lambda b: len(b.addresses) == MAX_PEER_ADDRESSES)
    _reaches(peer_announce_bodies, lambda b: not b.addresses and not b.allowed)
    _reaches(peer_announce_bodies, lambda b: b.ttl_s == MAX_PEER_TTL and b.observe)
    _reaches(peer_info_bodies, lambda b: len(b.fingerprint) == 64 and b.addresses)
    _reaches(presence_query_bodies, lambda b: len(b.orgs) == MAX_PRESENCE_ITEMS)
    _reaches(presence_bodies, lambda b: any(e.state is PresenceState.ONLINE for e in b.entries))
