"""End-to-end envelope: AAD, seal/open, tampering, wrong recipient, rollover,
the amortized Sealer/Opener, and the fit in a real DATA frame."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import x25519
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.identity.crypto import (
    BLOB_HEADER_SIZE,
    MAX_RECIPIENT_KEYS,
    WRAP_SIZE,
    DecryptError,
    Opener,
    Sealer,
    blob_key_ids,
    document_aad,
    document_aad_fields,
    document_aad_template,
    frame_aad,
    key_id,
    open_,
    parse_document_aad,
    raw_frame_aad,
    seal,
)
from semq.umxt_protocol import (
    LK0,
    LK1,
    MAX_SESSION_KEY,
    AppKey,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    Ping,
    ResultCode,
    SaveFwd,
    encode_frame,
    relay_bytes,
)
from tests.protocol import test_protocol_strategies as _strategies

A = Endpoint.org("56001")
B = Endpoint.org("56002")
C = Endpoint.org("56003")
KEY = AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001")


def aad(record: int = 7, source: Endpoint = A, target: Endpoint = B, app_key: AppKey = KEY,
        save_fwd: SaveFwd = SaveFwd.MUST_DELIVER) -> bytes:
    return document_aad(LK0(endpoint=source, record_id=record), source, target, app_key, save_fwd)


@pytest.fixture(scope="module")
def bkey() -> x25519.X25519PrivateKey:
    return x25519.X25519PrivateKey.generate()


# ---------------------------------------------------------------- AAD


@settings(max_examples=300, deadline=None)
@given(lk0=_strategies.lk0s(), source=_strategies.endpoints, target=_strategies.endpoints,
       app_key=_strategies.app_keys, save_fwd=st.sampled_from(list(SaveFwd)), flags=st.integers(0, 255),
       priority=_strategies.priorities, created=_strategies.times_ms, expires=_strategies.expiries)
def test_aad_from_fields_is_the_same_bytes(lk0: LK0, source: Endpoint, target: Endpoint, app_key: AppKey,
                                           save_fwd: SaveFwd, flags: int, priority: int, created: int,
                                           expires: int | None) -> None:
    """The origin's claim path builds the AAD from the row's fields: it must be
    byte for byte document_aad, or nothing it sends would open or verify."""
    want = document_aad(lk0, source, target, app_key, save_fwd, flags=flags, priority=priority,
                        created_ms=created, expires_ms=expires)
    assert document_aad_fields(
        lk0.endpoint, lk0.semq_id, lk0.semq_db_id, lk0.record_id, source, target, app_key.domain,
        app_key.data_type, app_key.subtype, app_key.key, int(save_fwd), flags, priority, created, expires,
    ) == want
    # ... and so does a batch's template, for this LK0 and for the next one.
    template = document_aad_template(lk0.endpoint, source, target, app_key.domain, app_key.data_type,
                                     app_key.subtype, app_key.key, int(save_fwd), flags, priority)
    assert template(lk0.semq_id, lk0.semq_db_id, lk0.record_id, created, expires) == want
    nxt = LK0(endpoint=lk0.endpoint, semq_id=lk0.semq_id, semq_db_id=lk0.semq_db_id,
              record_id=lk0.record_id % (2**63) + 1)
    assert template(nxt.semq_id, nxt.semq_db_id, nxt.record_id, created, expires) == document_aad(
        nxt, source, target, app_key, save_fwd, flags=flags, priority=priority, created_ms=created,
        expires_ms=expires)


def test_aad_is_canonical_and_parses_back() -> None:
    a = aad()
    assert a == aad()
    h = parse_document_aad(a)
    assert h.lk0 == LK0(endpoint=A, record_id=7)
    assert (h.source, h.target, h.app_key, h.save_fwd) == (A, B, KEY, SaveFwd.MUST_DELIVER)
    timed = document_aad(LK0(endpoint=A, record_id=7), A, B, KEY, SaveFwd.MUST_DELIVER, flags=0x0E,
                         priority=5, created_ms=1_700_000_000_000, expires_ms=1_700_000_060_000)
    h = parse_document_aad(timed)
    assert (h.flags, h.priority, h.created_ms, h.expires_ms) == (0x0E, 5, 1_700_000_000_000, 1_700_000_060_000)

    def header(**kw: int) -> bytes:
        base = {"flags": 0x0E, "priority": 5, "created_ms": 1_700_000_000_000, "expires_ms": 1_700_000_060_000}
        return document_aad(LK0(endpoint=A, record_id=7), A, B, KEY, SaveFwd.MUST_DELIVER, **{**base, **kw})

    variants = {
        aad(record=8), aad(target=C), aad(source=C), aad(save_fwd=SaveFwd.STORE),
        aad(app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0002")),
        # moving a byte between AppKey fields must change the bytes too
        aad(app_key=AppKey(domain="trad", data_type="eORDER", subtype="PO", key="S0001")),
        # every header field the relay could change is bound (not LK1, not the transport source)
        header(flags=0x0A), header(flags=0x0C), header(flags=0x1E), header(priority=0),
        header(created_ms=1_600_000_000_000), header(expires_ms=1), header(expires_ms=0), timed,
    }
    assert a not in variants and len(variants) == 14
    with pytest.raises(ValueError):
        parse_document_aad(a + b"x")
    with pytest.raises(ValueError):
        parse_document_aad(b"nope")


def test_frame_aad_uses_origin_not_relay() -> None:
    data = Data(lk0=LK0(endpoint=A, record_id=7), app_key=KEY, encrypt=True,
                session_key=b"k", app_data=b"x")
    direct = Frame(kind=Kind.DATA, source=A, target=B, body=data)
    relayed = Frame(kind=Kind.DATA, source=Endpoint.platform(), target=B, body=data)
    assert frame_aad(direct) == frame_aad(relayed) == document_aad(
        LK0(endpoint=A, record_id=7), A, B, KEY, SaveFwd.MUST_DELIVER, flags=direct.flags)
    ping = Frame(kind=Kind.PING, source=A, target=B, body=Ping())
    with pytest.raises(TypeError):
        frame_aad(ping)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), target=_strategies.endpoints, save_fwd=st.sampled_from([SaveFwd.STORE, SaveFwd.MUST_DELIVER]),
       relayed=st.booleans())
def test_raw_frame_aad_is_frame_aad(data: st.DataObject, target: Endpoint, save_fwd: SaveFwd,
                                    relayed: bool) -> None:
    """A receiver builds each document's AAD from the frame's bytes: the same
    bytes as frame_aad of the parsed frame, relayed or not."""
    body = data.draw(_strategies.data_bodies(), label="body")
    origin = body.lk0.endpoint
    frame = Frame(kind=Kind.DATA, source=origin, target=target, save_fwd=save_fwd, body=body)
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    raw = dec.next_frame()
    assert raw is not None
    if relayed:
        dec.receive_data(relay_bytes(raw, Endpoint.platform(), body.lk1 or LK1(record_id=9)))
        raw = dec.next_frame()
        assert raw is not None
    assert raw_frame_aad(raw) == frame_aad(raw.frame()) == frame_aad(frame)


# ---------------------------------------------------------------- seal / open


def test_round_trip_and_blob_layout(bkey: x25519.X25519PrivateKey) -> None:
    blob, ct = seal(b"order S0001", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    assert len(blob) == BLOB_HEADER_SIZE + WRAP_SIZE == 118
    assert blob[:4] == b"SQK1"
    assert blob_key_ids(blob) == [key_id(bkey.public_key())]
    assert b"order" not in ct and len(ct) == len(b"order S0001") + 16
    assert open_(blob, ct, recipient_enc_private_keys=[bkey], aad=aad()) == b"order S0001"


def test_fresh_key_per_document(bkey: x25519.X25519PrivateKey) -> None:
    b1, c1 = seal(b"same", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    b2, c2 = seal(b"same", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    assert b1 != b2 and c1 != c2


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes((data[i] ^ 1,)) + data[i + 1:]


def test_tampering_with_blob_or_ciphertext(bkey: x25519.X25519PrivateKey) -> None:
    blob, ct = seal(b"x" * 100, recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    for i in range(len(ct)):
        with pytest.raises(DecryptError) as e:
            open_(blob, _flip(ct, i), recipient_enc_private_keys=[bkey], aad=aad())
        assert e.value.code is ResultCode.DECRYPT_FAILED
    for i in range(len(blob)):  # every byte of the blob counts: header, salt, key id, wrap
        with pytest.raises(DecryptError):
            open_(_flip(blob, i), ct, recipient_enc_private_keys=[bkey], aad=aad())
    with pytest.raises(DecryptError, match="failed authentication"):
        open_(blob, ct[:-1], recipient_enc_private_keys=[bkey], aad=aad())
    with pytest.raises(DecryptError, match="malformed"):
        open_(blob + b"\0", ct, recipient_enc_private_keys=[bkey], aad=aad())
    with pytest.raises(DecryptError, match="does not start with"):
        open_(b"", ct, recipient_enc_private_keys=[bkey], aad=aad())


@pytest.mark.parametrize("changed", [
    aad(record=8),  # spliced onto another LK0 (or a replay under a new record)
    aad(target=C),  # redirected
    aad(source=C),  # claimed from another origin
    aad(save_fwd=SaveFwd.DISCARD),
    aad(app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S9999")),
])
def test_header_fields_are_bound(bkey: x25519.X25519PrivateKey, changed: bytes) -> None:
    blob, ct = seal(b"order", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    with pytest.raises(DecryptError, match=r"header fields it is bound to \(LK0, source, target"):
        open_(blob, ct, recipient_enc_private_keys=[bkey], aad=changed)


def test_blob_of_another_document_does_not_fit(bkey: x25519.X25519PrivateKey) -> None:
    sealer = Sealer()  # same file key for both: only the salt differs
    b1, _ = sealer.seal(b"one", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    b2, c2 = sealer.seal(b"two", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    assert b1[BLOB_HEADER_SIZE:] == b2[BLOB_HEADER_SIZE:]
    with pytest.raises(DecryptError):
        open_(b1, c2, recipient_enc_private_keys=[bkey], aad=aad())


def test_wrong_recipient(bkey: x25519.X25519PrivateKey) -> None:
    ckey = x25519.X25519PrivateKey.generate()
    blob, ct = seal(b"for B", recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    kid_b = key_id(bkey.public_key()).hex()
    kid_c = key_id(ckey.public_key()).hex()
    with pytest.raises(DecryptError, match=f"blob is for keys \\[{kid_b}\\], this node holds \\[{kid_c}\\]"):
        open_(blob, ct, recipient_enc_private_keys=[ckey], aad=aad())
    # a wrap relabelled with C's key id does not open with C's key
    forged = blob[:BLOB_HEADER_SIZE] + key_id(ckey.public_key()) + blob[BLOB_HEADER_SIZE + 16:]
    with pytest.raises(DecryptError, match=f"wrap for key {kid_c} failed authentication"):
        open_(forged, ct, recipient_enc_private_keys=[ckey], aad=aad())


def test_rollover_old_and_new_key() -> None:
    old, new = x25519.X25519PrivateKey.generate(), x25519.X25519PrivateKey.generate()
    blob, ct = seal(b"during overlap",
                    recipient_enc_public_keys=[new.public_key(), old.public_key()], aad=aad())
    assert len(blob) == BLOB_HEADER_SIZE + 2 * WRAP_SIZE
    assert open_(blob, ct, recipient_enc_private_keys=[old], aad=aad()) == b"during overlap"
    assert open_(blob, ct, recipient_enc_private_keys=[new], aad=aad()) == b"during overlap"
    # a node that still holds both keys opens documents sealed to either one
    only_old = seal(b"late sender", recipient_enc_public_keys=[old.public_key()], aad=aad())
    assert open_(*only_old, recipient_enc_private_keys=[new, old], aad=aad()) == b"late sender"


def test_recipient_limits(bkey: x25519.X25519PrivateKey) -> None:
    keys = [x25519.X25519PrivateKey.generate().public_key() for _ in range(MAX_RECIPIENT_KEYS)]
    blob, _ = seal(b"x", recipient_enc_public_keys=keys, aad=aad())
    assert len(blob) <= MAX_SESSION_KEY
    with pytest.raises(ValueError, match="17 recipient keys exceed the 16-key limit"):
        seal(b"x", recipient_enc_public_keys=[*keys, bkey.public_key()], aad=aad())
    with pytest.raises(ValueError, match="no recipient key"):
        seal(b"x", recipient_enc_public_keys=[], aad=aad())
    dup = seal(b"x", recipient_enc_public_keys=[bkey.public_key()] * 3, aad=aad())[0]
    assert len(blob_key_ids(dup)) == 1


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=70_000), record=st.integers(1, 2**64 - 1),
       amortized=st.booleans())
def test_round_trip_any_payload(payload: bytes, record: int, amortized: bool) -> None:
    key = _HYP_KEY
    a = aad(record=record)
    if amortized:
        blob, ct = _HYP_SEALER.seal(payload, recipient_enc_public_keys=[key.public_key()], aad=a)
        assert _HYP_OPENER.open(blob, ct, aad=a) == payload
    else:
        blob, ct = seal(payload, recipient_enc_public_keys=[key.public_key()], aad=a)
        assert open_(blob, ct, recipient_enc_private_keys=[key], aad=a) == payload
    assert len(ct) == len(payload) + 16


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 4096, 65_536, 1 << 20])
def test_round_trip_sizes(bkey: x25519.X25519PrivateKey, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    blob, ct = seal(payload, recipient_enc_public_keys=[bkey.public_key()], aad=aad())
    assert open_(blob, ct, recipient_enc_private_keys=[bkey], aad=aad()) == payload


_HYP_KEY = x25519.X25519PrivateKey.generate()
_HYP_SEALER = Sealer()
_HYP_OPENER = Opener([_HYP_KEY])


# ---------------------------------------------------------------- amortized


def test_sealer_epochs_and_opener_cache(bkey: x25519.X25519PrivateKey) -> None:
    clock = [0.0]
    sealer = Sealer(max_age=60, max_uses=3, clock=lambda: clock[0])
    pub = [bkey.public_key()]
    blobs = [sealer.seal(b"d%d" % i, recipient_enc_public_keys=pub, aad=aad(record=i + 1))[0]
             for i in range(4)]
    wraps = [b[BLOB_HEADER_SIZE:] for b in blobs]
    assert wraps[0] == wraps[1] == wraps[2] != wraps[3]  # max_uses=3
    clock[0] = 61
    b5, c5 = sealer.seal(b"later", recipient_enc_public_keys=pub, aad=aad())
    assert b5[BLOB_HEADER_SIZE:] != wraps[3]  # max_age
    other = x25519.X25519PrivateKey.generate().public_key()
    b6, _ = sealer.seal(b"two keys", recipient_enc_public_keys=[*pub, other], aad=aad())
    assert len(blob_key_ids(b6)) == 2
    sealer.clear()
    b7, _ = sealer.seal(b"fresh", recipient_enc_public_keys=pub, aad=aad())
    assert b7[BLOB_HEADER_SIZE:] != b5[BLOB_HEADER_SIZE:]

    opener = Opener([bkey], cache_size=2)
    assert opener.key_ids == [key_id(bkey.public_key())]
    assert opener.open(b5, c5, aad=aad()) == b"later"
    assert opener.open(b5, c5, aad=aad()) == b"later"  # cached file key
    with pytest.raises(DecryptError):  # the cache never skips the per-document check
        opener.open(b5, c5, aad=aad(record=99))
    with pytest.raises(DecryptError):
        opener.open(_flip(b5, BLOB_HEADER_SIZE + 40), c5, aad=aad())
    # interoperable with the stateless functions
    assert open_(b5, c5, recipient_enc_private_keys=[bkey], aad=aad()) == b"later"


def test_suites_one_and_two(bkey: x25519.X25519PrivateKey) -> None:
    """Suite 2 (the default): one content key per file key, a random nonce per
    document; suite 1 (per-document content key) is still sealed on request
    and opened. Both open with open_ and with a cached Opener, and a blob's
    suite byte cannot be changed (it is in the wrap's and the content's AAD)."""
    opener = Opener([bkey])
    pub = [bkey.public_key()]
    for suite in (1, 2):
        sealer = Sealer(suite=suite)
        one = seal(b"doc", recipient_enc_public_keys=pub, aad=aad(), suite=suite)
        many = [sealer.seal(b"doc %d" % i, recipient_enc_public_keys=pub, aad=aad(record=i + 1))
                for i in range(300)]
        for blob, _ in [one, *many]:
            assert blob[4] == suite
        assert open_(*one, recipient_enc_private_keys=[bkey], aad=aad()) == b"doc"
        for i, (blob, ct) in enumerate(many):
            assert opener.open(blob, ct, aad=aad(record=i + 1)) == b"doc %d" % i
            assert open_(blob, ct, recipient_enc_private_keys=[bkey], aad=aad(record=i + 1)) == b"doc %d" % i
        # one epoch: the same wraps, a different 16-byte random field (suite 2: the nonce) each time
        assert len({b[BLOB_HEADER_SIZE:] for b, _ in many}) == 1
        assert len({b[5:5 + 12] for b, _ in many}) == len(many)
        other = 3 - suite
        blob, ct = many[0]
        relabelled = blob[:4] + bytes((other,)) + blob[5:]
        with pytest.raises(DecryptError):
            open_(relabelled, ct, recipient_enc_private_keys=[bkey], aad=aad(record=1))
        with pytest.raises(DecryptError):
            opener.open(relabelled, ct, aad=aad(record=1))
    assert seal(b"x", recipient_enc_public_keys=pub, aad=aad())[0][4] == 2
    with pytest.raises(ValueError, match="suite 3 is not one of"):
        seal(b"x", recipient_enc_public_keys=pub, aad=aad(), suite=3)
    with pytest.raises(ValueError, match="suite 0 is not one of"):
        Sealer(suite=0)
    with pytest.raises(ValueError, match="max_uses 16777217 is outside"):
        Sealer(max_uses=(1 << 24) + 1)
    with pytest.raises(DecryptError, match="uses suite 9; this node knows suites 1 and 2"):
        open_(b"SQK1\x09" + bytes(BLOB_HEADER_SIZE - 5 + WRAP_SIZE), b"", recipient_enc_private_keys=[bkey],
              aad=aad())


# ---------------------------------------------------------------- in a frame


def test_sealed_document_travels_in_a_data_frame(bkey: x25519.X25519PrivateKey) -> None:
    lk0 = LK0(endpoint=A, record_id=42)
    # The AAD binds the header as sent, Encrypt flag included (the session
    # key's bytes are not in it).
    header = Data(lk0=lk0, app_key=KEY, encrypt=True, session_key=b"to be made")
    plain = Frame(kind=Kind.DATA, source=A, target=B, body=header)
    a = frame_aad(plain)
    blob, ct = seal(b"<order/>", recipient_enc_public_keys=[bkey.public_key()], aad=a)
    frame = Frame(kind=Kind.DATA, source=A, target=B, body=Data(
        lk0=lk0, app_key=KEY, encrypt=True, session_key=blob, app_data=ct))
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    raw = dec.next_frame()
    assert raw is not None
    # the platform stores it and relays it later: new transport source, LK1 set
    dec.receive_data(relay_bytes(raw, Endpoint.platform(), LK1(record_id=9)))
    relayed = dec.next_frame()
    assert relayed is not None
    got = relayed.frame()
    assert isinstance(got.body, Data) and got.source == Endpoint.platform()
    assert open_(got.body.session_key, got.body.app_data, recipient_enc_private_keys=[bkey],
                 aad=frame_aad(got)) == b"<order/>"
    # the relay redirects the frame to C: the receiver's AAD no longer matches
    moved = Frame(kind=Kind.DATA, source=Endpoint.platform(), target=C, origin=A, body=got.body)
    with pytest.raises(DecryptError):
        open_(blob, ct, recipient_enc_private_keys=[bkey], aad=frame_aad(moved))
    # ... or changes a header field it could reach: expiry, creation time, priority, Ack2
    body = got.body
    for changed in (
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=B, origin=A,
              body=Data(lk0=lk0, app_key=KEY, encrypt=True, session_key=blob, app_data=ct, expires_ms=1)),
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=B, origin=A,
              body=Data(lk0=lk0, app_key=KEY, encrypt=True, session_key=blob, app_data=ct, created_ms=1)),
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=B, origin=A, body=body, priority=9),
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=B, origin=A, body=body, ack2=True),
    ):
        with pytest.raises(DecryptError):
            open_(blob, ct, recipient_enc_private_keys=[bkey], aad=frame_aad(changed))
