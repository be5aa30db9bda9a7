"""Document signatures (single and batch), sign-then-seal, receipts (single,
batch, batch proofs) and the Merkle tree under them."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.identity.crypto import (
    MAX_RECEIPT,
    BadSignature,
    CertificateAuthority,
    DecryptError,
    NodeCertificate,
    NodeIdentity,
    NodeKeys,
    Opener,
    ReceiptForm,
    SignatureCache,
    UnknownCertificate,
    ack_entry_lk0,
    document_aad,
    document_digest,
    document_salt,
    document_salts,
    make_batch_receipt,
    make_csr,
    make_receipt,
    open_document,
    open_documents,
    protect_document,
    protect_documents,
    receipt_proofs,
    seal,
    sign_document,
    sign_documents,
    verify_batch_receipt,
    verify_document,
    verify_node_certificate,
    verify_receipt,
)
from semq.identity.crypto._merkle import MerkleTree, leaf_hash, root_from_path
from semq.umxt_protocol import (
    LK0,
    MAX_ACK_BATCH,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Endpoint,
    Kind,
    ResultCode,
    SaveFwd,
)

KEY = AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001")


@dataclass
class World:
    ca: CertificateAuthority
    a: NodeIdentity  # origin 56001
    b: NodeIdentity  # receiver 56002
    c: NodeIdentity  # a third org 56003

    def aad(self, record: int = 1, source: str = "56001", target: str = "56002") -> bytes:
        s, t = Endpoint.org(source), Endpoint.org(target)
        return document_aad(LK0(endpoint=s, record_id=record), s, t, KEY, SaveFwd.MUST_DELIVER)


def identity(ca: CertificateAuthority, org: str, **kw: object) -> NodeIdentity:
    keys = NodeKeys.generate()
    cert: x509.Certificate = ca.issue_node_certificate(make_csr(keys, org), **kw)  # type: ignore[arg-type]
    return NodeIdentity(keys, verify_node_certificate(cert, ca=ca.certificate, crl=None))


@pytest.fixture(scope="module")
def w() -> World:
    ca = CertificateAuthority.create("Signing CA")
    return World(ca, identity(ca, "56001"), identity(ca, "56002"), identity(ca, "56003"))


def certs(*ids: NodeIdentity) -> list[NodeCertificate]:
    return [i.certificate for i in ids]


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes((data[i] ^ 1,)) + data[i + 1:]


# ---------------------------------------------------------------- signatures


def test_sign_and_verify(w: World) -> None:
    signed = sign_document(b"<order/>", aad=w.aad(), signing_key=w.a.keys.signing_key)
    assert signed.container[:4] == b"SQD1"
    doc = verify_document(signed.container, aad=w.aad(), signer_certs=certs(w.a))
    assert doc.body == b"<order/>" and doc.digest == signed.digest and doc.org == "56001"
    assert doc.batch_size == 1 and not doc.encrypted
    salt = signed.container[21:37]
    assert doc.digest == document_digest(w.aad(), b"<order/>", salt)



def test_given_salts_make_the_same_digest_again(w: World) -> None:
    """A node signs each document with document_salt(its key, the AAD): a
    resend, signed again in another batch, has the same digest. The salt
    depends on the key and the header; a salt of the wrong size is refused."""
    key, other = b"k" * 32, b"o" * 32
    items = [(w.aad(record=i + 1), b"doc %d" % i) for i in range(3)]
    salts = [document_salt(key, aad) for aad, _ in items]
    assert len(set(salts)) == 3 and all(len(x) == 16 for x in salts)
    # The derivation docs/security.md gives, for the single and the batch form.
    assert salts == [hmac.digest(key, b"SEMQ-SALT-v1\x00" + aad, "sha256")[:16] for aad, _ in items]
    assert document_salts(key, [aad for aad, _ in items]) == salts
    assert document_salts(key, []) == []
    assert document_salt(other, items[0][0]) != salts[0]
    batch = sign_documents(items, signing_key=w.a.keys.signing_key, salts=salts)
    alone = sign_documents(items[1:2], signing_key=w.a.keys.signing_key, salts=salts[1:2])
    assert alone[0].digest == batch[1].digest and alone[0].container != batch[1].container
    assert [d.digest for d in batch] == [document_digest(aad, body, x) for (aad, body), x in zip(items, salts, strict=True)]
    for (aad, body), d in zip(items, batch, strict=True):
        assert verify_document(d.container, aad=aad, signer_certs=certs(w.a)).body == body
    random = sign_documents(items, signing_key=w.a.keys.signing_key)
    assert all(r.digest != d.digest for r, d in zip(random, batch, strict=True))
    with pytest.raises(ValueError, match="salt of 15 bytes is not 16"):
        sign_document(b"x", aad=items[0][0], signing_key=w.a.keys.signing_key, salt=b"s" * 15)
    with pytest.raises(ValueError, match="2 salts for 3 documents"):
        protect_documents([(aad, body, None) for aad, body in items], signing_key=w.a.keys.signing_key,
                          salts=salts[:2])


def test_tampered_container_refused(w: World) -> None:
    c = sign_document(b"<order qty='5'/>", aad=w.aad(), signing_key=w.a.keys.signing_key).container
    for i in range(4, len(c)):
        with pytest.raises((BadSignature, UnknownCertificate)) as e:
            verify_document(_flip(c, i), aad=w.aad(), signer_certs=certs(w.a))
        assert e.value.code in (ResultCode.BAD_SIGNATURE, ResultCode.UNKNOWN_CERTIFICATE)
    with pytest.raises(BadSignature, match="does not verify: body or header changed") as e:
        verify_document(c[:-1] + b"6", aad=w.aad(), signer_certs=certs(w.a))
    assert e.value.code is ResultCode.BAD_SIGNATURE
    with pytest.raises(BadSignature, match="not a signed container"):
        verify_document(b"plain text", aad=w.aad(), signer_certs=certs(w.a))
    with pytest.raises(BadSignature, match="trailing bytes"):
        verify_document(c + b"x", aad=w.aad(), signer_certs=certs(w.a))
    for bad_aad in (b"", b"garbage", w.aad()[:14], w.aad()[:30]):
        with pytest.raises(BadSignature, match="not verifiable"):
            verify_document(c, aad=bad_aad, signer_certs=certs(w.a))


def test_signature_binds_header(w: World) -> None:
    c = sign_document(b"doc", aad=w.aad(), signing_key=w.a.keys.signing_key).container
    with pytest.raises(BadSignature):
        verify_document(c, aad=w.aad(record=2), signer_certs=certs(w.a))
    with pytest.raises(BadSignature):
        verify_document(c, aad=w.aad(target="56003"), signer_certs=certs(w.a))


def test_signer_must_be_the_source(w: World) -> None:
    # C signs a document claiming to come from A; the receiver looks up A's
    # certificates (C's key is unknown there) or, careless, passes C's too.
    c = sign_document(b"forged", aad=w.aad(), signing_key=w.c.keys.signing_key).container
    with pytest.raises(UnknownCertificate, match="not among the known certificates") as e:
        verify_document(c, aad=w.aad(), signer_certs=certs(w.a))
    assert e.value.code is ResultCode.UNKNOWN_CERTIFICATE
    with pytest.raises(BadSignature, match="from org 56001 is signed by org 56003"):
        verify_document(c, aad=w.aad(), signer_certs=certs(w.a, w.c))


def test_signer_rollover(w: World) -> None:
    a_new = identity(w.ca, "56001")
    c_old = sign_document(b"old", aad=w.aad(), signing_key=w.a.keys.signing_key).container
    c_new = sign_document(b"new", aad=w.aad(), signing_key=a_new.keys.signing_key).container
    both = certs(a_new, w.a)
    assert verify_document(c_old, aad=w.aad(), signer_certs=both).body == b"old"
    assert verify_document(c_new, aad=w.aad(), signer_certs=both).body == b"new"


def test_batch_signatures(w: World) -> None:
    items = [(w.aad(record=i), b"doc %d" % i) for i in range(1, 8)]
    signed = sign_documents(items, signing_key=w.a.keys.signing_key)
    assert len({s.container[37:101] for s in signed}) == 1  # one signature for all
    cache = SignatureCache()
    calls = []
    original = cache.verify

    def counting(*args: object) -> None:
        calls.append(1)
        original(*args)  # type: ignore[arg-type]

    for (aad, body), s in zip(items, signed, strict=True):
        doc = verify_document(s.container, aad=aad, signer_certs=certs(w.a), cache=cache)
        assert doc.body == body and doc.digest == s.digest and doc.batch_size == 7
        # each verifies alone too
        assert verify_document(s.container, aad=aad, signer_certs=certs(w.a)).body == body
    assert len(cache._seen) == 1
    # a document moved to another position or header fails
    with pytest.raises(BadSignature):
        verify_document(signed[0].container, aad=items[1][0], signer_certs=certs(w.a))
    # a corrupted path fails
    path_at = 101 + 4 + 4 + 1
    with pytest.raises(BadSignature):
        verify_document(_flip(signed[3].container, path_at), aad=items[3][0],
                        signer_certs=certs(w.a), cache=cache)
    assert sign_documents([], signing_key=w.a.keys.signing_key) == []
    one = sign_documents(items[:1], signing_key=w.a.keys.signing_key)
    assert one[0].container[4] == 1


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 70), data=st.data())
def test_batch_verification_with_proven_nodes_is_exact(w: World, n: int, data: st.DataObject) -> None:
    """A receiver's SignatureCache keeps the Merkle nodes proven under a batch
    signature, so later documents of the batch are checked against them
    instead of hashing their whole path. It must give exactly the answer of
    a cache-less check: whatever is changed in a container (path, position,
    body, salt, batch size), in whatever order documents arrive."""
    items = [(w.aad(record=i + 1), b"doc %d" % i) for i in range(n)]
    signed = [s.container for s in sign_documents(items, signing_key=w.a.keys.signing_key)]
    cache = SignatureCache(max_nodes=data.draw(st.sampled_from([8, 1 << 18]), label="max_nodes"))
    order = data.draw(st.permutations(range(n)), label="order")
    path_at = 110  # after magic, mode, key id, salt, signature, n, index, path length
    for i in order:
        aad, body = items[i]
        c = signed[i]
        m = c[109]  # this leaf's path length (leaves of an odd tree differ)
        where = data.draw(st.sampled_from(["none", "path", "index", "size", "body", "salt"]), label="change")
        bad = c
        if where == "path" and m:
            bad = _flip(c, path_at + data.draw(st.integers(0, 32 * m - 1), label="byte"))
        elif where == "index":
            bad = c[:105] + (data.draw(st.integers(0, n - 1), label="to") ^ 0).to_bytes(4, "big") + c[109:]
        elif where == "size":
            bad = c[:101] + data.draw(st.integers(2, n + 3), label="n").to_bytes(4, "big") + c[105:]
        elif where == "body":
            bad = c[:-1] + bytes((c[-1] ^ 1,))
        elif where == "salt":
            bad = _flip(c, 21)
        try:
            verify_document(bad, aad=aad, signer_certs=certs(w.a))
            expected: object = "ok"
        except BadSignature:
            expected = BadSignature
        try:
            verify_document(bad, aad=aad, signer_certs=certs(w.a), cache=cache)
            got: object = "ok"
        except BadSignature:
            got = BadSignature
        assert got == expected, (where, i)
        # the genuine document verifies, with the cache as without
        assert verify_document(c, aad=aad, signer_certs=certs(w.a), cache=cache).body == body


def test_proven_nodes_make_later_documents_cheap(w: World) -> None:
    """After one document of a 512-batch, the others are proven with about
    one hash each, not log2(512) = 9 (the receiver's hot path)."""
    items = [(w.aad(record=i + 1), b"doc %d" % i) for i in range(512)]
    signed = sign_documents(items, signing_key=w.a.keys.signing_key)
    cache = SignatureCache()
    from semq.identity.crypto import _signing
    calls = 0
    real = _signing._sha256

    def counting(data: bytes = b"") -> object:
        nonlocal calls
        calls += 1
        return real(data)

    _signing._sha256 = counting  # type: ignore[assignment]
    try:
        for (aad, _), sd in zip(items, signed, strict=True):
            verify_document(sd.container, aad=aad, signer_certs=certs(w.a), cache=cache)
    finally:
        _signing._sha256 = real
    assert calls < 2 * 512  # inner-node hashes (leaf and digest hashes are not counted)
    assert len(cache._seen) == 1


# ---------------------------------------------------------------- sign-then-seal


def test_protect_and_open_document(w: World) -> None:
    b_new = identity(w.ca, "56002")
    doc = protect_document(b"<order/>", aad=w.aad(), signing_key=w.a.keys.signing_key,
                           recipients=certs(b_new, w.b))
    assert doc.encrypt and b"<order/>" not in doc.app_data
    for keys in ([w.b.keys.encryption_key], Opener([b_new.keys.encryption_key])):
        got = open_document(doc.app_data, doc.session_key, aad=w.aad(), keys=keys,
                            signer_certs=certs(w.a))
        assert got.body == b"<order/>" and got.encrypted and got.digest == doc.digest
    # C cannot read it
    with pytest.raises(DecryptError):
        open_document(doc.app_data, doc.session_key, aad=w.aad(),
                      keys=[w.c.keys.encryption_key], signer_certs=certs(w.a))


def test_no_encrypt_is_signed_but_readable(w: World) -> None:
    doc = protect_document(b"<order/>", aad=w.aad(), signing_key=w.a.keys.signing_key,
                           recipients=None)
    assert not doc.encrypt and b"<order/>" in doc.app_data
    got = open_document(doc.app_data, b"", aad=w.aad(), keys=[w.b.keys.encryption_key],
                        signer_certs=certs(w.a))
    assert got.body == b"<order/>" and not got.encrypted
    with pytest.raises(DecryptError, match="arrived unencrypted"):
        open_document(doc.app_data, b"", aad=w.aad(), keys=[w.b.keys.encryption_key],
                      signer_certs=certs(w.a), require_encryption=True)


def test_receiver_cannot_forward_as_if_sent_to_third_party(w: World) -> None:
    # B opens A's document and re-seals the signed container to C with a header
    # naming C as target: C's check of A's signature fails (it names B).
    doc = protect_document(b"pay 100", aad=w.aad(), signing_key=w.a.keys.signing_key,
                           recipients=certs(w.b))
    from semq.identity.crypto import open_

    container = open_(doc.session_key, doc.app_data,
                      recipient_enc_private_keys=[w.b.keys.encryption_key], aad=w.aad())
    to_c = w.aad(target="56003")
    blob, ct = seal(container, recipient_enc_public_keys=[w.c.certificate.encryption_public_key],
                    aad=to_c)
    with pytest.raises(BadSignature):
        open_document(ct, blob, aad=to_c, keys=[w.c.keys.encryption_key], signer_certs=certs(w.a))


def test_protect_documents_batch(w: World) -> None:
    items = [(w.aad(record=i), b"d%d" % i, certs(w.b)) for i in range(1, 5)]
    out = protect_documents(items, signing_key=w.a.keys.signing_key)
    opener = Opener([w.b.keys.encryption_key])
    cache = SignatureCache()
    for (aad, body, _), p in zip(items, out, strict=True):
        got = open_document(p.app_data, p.session_key, aad=aad, keys=opener,
                            signer_certs=certs(w.a), cache=cache)
        assert got.body == body and got.batch_size == 4


def _outcome(fn: object, *args: object, **kw: object) -> object:
    """What a check gives: its result, or the class and words of its error."""
    try:
        return fn(*args, **kw)  # type: ignore[operator]
    except (BadSignature, UnknownCertificate, DecryptError) as e:
        return (type(e), str(e))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_open_documents_is_open_document_for_each(w: World, n: int, data: st.DataObject) -> None:
    """A receiver opens the DATA of a received batch at once: documents of
    one batch signature are checked together (the tree built from their
    leaves, every path compared with it), whatever part of the batch is at
    hand. Each answer must be exactly open_document's, class and words:
    with a document changed anywhere (path, position, size, body, salt, key
    id), repeated, left out, or another's path in its place; sealed or not;
    with a cache, warm or cold, or none."""
    sealed = data.draw(st.booleans(), label="sealed")
    items = [(w.aad(record=i + 1), b"doc %d" % i, certs(w.b) if sealed else None) for i in range(n)]
    prot = protect_documents(items, signing_key=w.a.keys.signing_key)
    containers = [p.app_data for p in prot]
    chosen = data.draw(st.lists(st.integers(0, n - 1), max_size=n + 3), label="chosen")
    if data.draw(st.booleans(), label="whole batch"):
        chosen = [*range(n), *chosen]
    batch = []
    for i in chosen:
        aad, _, _ = items[i]
        app = containers[i]
        change = data.draw(st.sampled_from(["none"] * 4 + ["path", "index", "size", "body", "salt",
                                                          "kid", "other path", "short path"]), label="change")
        if not sealed and change != "none":
            m = app[109] if app[4] == 2 else 0
            if change == "path" and m:
                app = _flip(app, 110 + data.draw(st.integers(0, 32 * m - 1), label="byte"))
            elif change == "index" and m:
                app = app[:105] + data.draw(st.integers(0, n), label="to").to_bytes(4, "big") + app[109:]
            elif change == "size" and m:
                app = app[:101] + data.draw(st.integers(2, n + 2), label="n").to_bytes(4, "big") + app[105:]
            elif change == "body":
                app = app[:-1] + bytes((app[-1] ^ 1,))
            elif change == "salt":
                app = _flip(app, 21)
            elif change == "kid":
                app = _flip(app, 5)
            elif change == "other path" and m:
                j = data.draw(st.integers(0, n - 1), label="from")
                other = containers[j]
                if other[109] == m:
                    app = app[:110] + other[110:110 + 32 * m] + app[110 + 32 * m:]
            elif change == "short path" and m:
                app = app[:109] + bytes((m - 1,)) + app[110:110 + 32 * (m - 1)] + app[110 + 32 * m:]
        elif sealed and change == "body":
            app = _flip(app, len(app) - 1)  # the ciphertext: DECRYPT_FAILED
        batch.append((app, prot[i].session_key, aad, certs(w.a)))
    keys = Opener([w.b.keys.encryption_key])
    cache_kind = data.draw(st.sampled_from(["none", "cold", "warm"]), label="cache")
    cache = None if cache_kind == "none" else SignatureCache()
    if cache is not None and cache_kind == "warm" and batch:
        open_documents(batch[: len(batch) // 2], keys=keys, cache=cache)
    expected = [_outcome(open_document, a, k, aad=aad, keys=keys, signer_certs=c) for a, k, aad, c in batch]
    got = open_documents(batch, keys=keys, cache=cache)
    assert [g if not isinstance(g, Exception) else (type(g), str(g)) for g in got] == expected


def test_open_documents_checks_a_batch_with_one_tree(w: World) -> None:
    """The 512 documents of a signed batch, received in two parts: none is
    checked on its own, about one inner-node hash per document, one
    signature check for both parts."""
    items = [(w.aad(record=i + 1), b"doc %d" % i, certs(w.b)) for i in range(512)]
    prot = protect_documents(items, signing_key=w.a.keys.signing_key)
    batch = [(p.app_data, p.session_key, aad, certs(w.a)) for p, (aad, _, _) in zip(prot, items, strict=True)]
    keys, cache = Opener([w.b.keys.encryption_key]), SignatureCache()
    from semq.identity.crypto import _document, _signing
    hashes, alone = 0, 0
    real_hash, real_verify = _signing._sha256, _document._verify

    def counting(data: bytes = b"") -> object:
        nonlocal hashes
        hashes += 1
        return real_hash(data)

    def verify_alone(*args: object) -> object:
        nonlocal alone
        alone += 1
        return real_verify(*args)  # type: ignore[arg-type]

    _signing._sha256, _document._verify = counting, verify_alone  # type: ignore[assignment]
    try:
        got = open_documents(batch[:300], keys=keys, cache=cache) + open_documents(batch[300:], keys=keys, cache=cache)
    finally:
        _signing._sha256, _document._verify = real_hash, real_verify  # type: ignore[assignment]
    assert [g.body for g in got] == [body for _, body, _ in items]  # type: ignore[union-attr]
    assert alone == 0
    assert hashes < 2 * 512 + 2 * 9  # a leaf and ~one inner node each, a path's worth per part
    assert len(cache._seen) == 1


@pytest.mark.parametrize("part", [range(8), range(3), range(1, 6)])
def test_open_documents_refuses_a_path_it_does_not_need(w: World, part: range) -> None:
    """A path hash the batch check never uses (its sibling is at hand) still
    has to be right: that document is refused, as open_document refuses it,
    and the others of the batch are not."""
    items = [(w.aad(record=i + 1), b"doc %d" % i) for i in range(8)]
    containers = [s.container for s in sign_documents(items, signing_key=w.a.keys.signing_key)]
    first = part[0]
    bad = _flip(containers[first], 110)  # its first path hash: the sibling leaf's
    batch = [(bad if i == first else containers[i], b"", items[i][0], certs(w.a)) for i in part]
    got = open_documents(batch, keys=[w.b.keys.encryption_key], cache=SignatureCache())
    assert isinstance(got[0], BadSignature)
    assert [g.body for g in got[1:]] == [items[i][1] for i in part[1:]]  # type: ignore[union-attr]


# ---------------------------------------------------------------- receipts


def test_single_receipt(w: World) -> None:
    lk0 = LK0(endpoint=Endpoint.org("56001"), record_id=42)
    digest = hashlib.sha256(b"d").digest()
    r = make_receipt(digest, lk0, w.b.keys.signing_key, time_ms=1_700_000_000_000)
    assert len(r) <= MAX_RECEIPT and r[:4] == b"SQR1"
    Ack(dest_ref_id=42, ack_flag=AckFlag.DELIVERY, receipt=r)  # fits the frame
    info = verify_receipt(r, digest=digest, lk0=lk0, receiver_certs=certs(w.b))
    assert info.org == "56002" and info.form is ReceiptForm.SINGLE
    assert info.time_ms == 1_700_000_000_000 and info.lk0 == lk0 and info.digest == digest
    # forged: any flipped byte, another digest, another document, another signer
    for i in range(4, len(r)):
        with pytest.raises((BadSignature, UnknownCertificate)):
            verify_receipt(_flip(r, i), digest=digest, lk0=lk0, receiver_certs=certs(w.b))
    with pytest.raises(BadSignature, match="not 56001/1/1/42 with the digest sent"):
        verify_receipt(r, digest=hashlib.sha256(b"e").digest(), lk0=lk0, receiver_certs=certs(w.b))
    other = LK0(endpoint=Endpoint.org("56001"), record_id=43)
    with pytest.raises(BadSignature, match="names document 56001/1/1/42, not 56001/1/1/43"):
        verify_receipt(r, digest=digest, lk0=other, receiver_certs=certs(w.b))
    by_c = make_receipt(digest, lk0, w.c.keys.signing_key)
    with pytest.raises(UnknownCertificate, match="not among the receiver's certificates"):
        verify_receipt(by_c, digest=digest, lk0=lk0, receiver_certs=certs(w.b))
    # a forger who knows B's key id but not its key
    forged = by_c[:5] + w.b.keys.signing_key_id + by_c[21:]
    with pytest.raises(BadSignature, match=r"signed by org 56002 .* does not verify: forged"):
        verify_receipt(forged, digest=digest, lk0=lk0, receiver_certs=certs(w.b))


def test_end_to_end_receipt_for_a_document(w: World) -> None:
    lk0 = LK0(endpoint=Endpoint.org("56001"), record_id=1)
    sent = protect_document(b"<order/>", aad=w.aad(), signing_key=w.a.keys.signing_key,
                            recipients=certs(w.b))
    got = open_document(sent.app_data, sent.session_key, aad=w.aad(),
                        keys=[w.b.keys.encryption_key], signer_certs=certs(w.a))
    receipt = make_receipt(got.digest, lk0, w.b.keys.signing_key)
    assert verify_receipt(receipt, digest=sent.digest, lk0=lk0,
                          receiver_certs=certs(w.b)).org == "56002"


def test_batch_receipt_and_proofs(w: World) -> None:
    origin = Endpoint.org("56001")
    entries = [(LK0(endpoint=origin, record_id=i), hashlib.sha256(b"%d" % i).digest())
               for i in range(1, 12)]
    r = make_batch_receipt(entries, w.b.keys.signing_key)
    assert len(r) == 129
    batch = AckBatch(ack_kind=Kind.ACK2, entries=tuple(
        AckEntry.of(lk0.record_id, AckFlag.DELIVERY) for lk0, _ in entries), receipt=r)
    # the origin rebuilds the manifest from the AckBatch and its stored digests
    stored = dict(entries)
    manifest = [(ack_entry_lk0(e, origin), stored[ack_entry_lk0(e, origin)])
                for e in batch.entries]
    assert manifest == entries
    info = verify_batch_receipt(batch.receipt, entries=manifest, receiver_certs=certs(w.b))
    assert info.form is ReceiptForm.BATCH and info.batch_size == 11 and info.org == "56002"
    # reordered, missing, or a changed digest: refused
    with pytest.raises(BadSignature, match="does not match these documents"):
        verify_batch_receipt(r, entries=[entries[1], entries[0], *entries[2:]],
                             receiver_certs=certs(w.b))
    with pytest.raises(BadSignature, match="covers 11 documents, the batch holds 10"):
        verify_batch_receipt(r, entries=entries[:-1], receiver_certs=certs(w.b))
    bad = [*entries[:-1], (entries[-1][0], hashlib.sha256(b"x").digest())]
    with pytest.raises(BadSignature):
        verify_batch_receipt(r, entries=bad, receiver_certs=certs(w.b))
    with pytest.raises(BadSignature, match="needs verify_batch_receipt"):
        verify_receipt(r, digest=entries[0][1], lk0=entries[0][0], receiver_certs=certs(w.b))
    # one proof per document, each verifiable alone
    proofs = receipt_proofs(r, entries)
    for (lk0, digest), p in zip(entries, proofs, strict=True):
        assert len(p) <= MAX_RECEIPT
        i = verify_receipt(p, digest=digest, lk0=lk0, receiver_certs=certs(w.b))
        assert i.form is ReceiptForm.BATCH_PROOF and i.lk0 == lk0 and i.batch_size == 11
    with pytest.raises(BadSignature):
        verify_receipt(proofs[0], digest=entries[1][1], lk0=entries[1][0],
                       receiver_certs=certs(w.b))
    with pytest.raises(BadSignature):
        verify_receipt(_flip(proofs[3], len(proofs[3]) - 5), digest=entries[3][1],
                       lk0=entries[3][0], receiver_certs=certs(w.b))
    with pytest.raises(ValueError, match="do not match"):
        receipt_proofs(r, entries[:-1])
    with pytest.raises(ValueError, match=r"outside 1\.\.100000"):
        make_batch_receipt([], w.b.keys.signing_key)


def test_batch_proof_size_at_the_frame_limit(w: World) -> None:
    origin = Endpoint.org("x" * 64)  # the longest node id
    n = MAX_ACK_BATCH
    digest = bytes(32)
    entries = [(LK0(endpoint=origin, record_id=i + 1), digest) for i in range(n)]
    r = make_batch_receipt(entries, w.b.keys.signing_key)
    tree_proof = receipt_proofs(r, entries)[n - 1]
    assert len(tree_proof) <= MAX_RECEIPT


# ---------------------------------------------------------------- Merkle


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 MTH, recursive, as the reference."""
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), data=st.data())
def test_merkle_matches_rfc9162(n: int, data: st.DataObject) -> None:
    leaves = [leaf_hash(b"%d" % i) for i in range(n)]
    tree = MerkleTree(leaves)
    assert tree.root == _mth(leaves)
    i = data.draw(st.integers(0, n - 1))
    assert root_from_path(leaves[i], i, n, tree.path(i)) == tree.root
    if n > 1:
        j = (i + 1) % n
        try:  # the path of another position: wrong length, or a wrong root
            assert root_from_path(leaves[i], j, n, tree.path(i)) != tree.root
        except ValueError:
            pass
        with pytest.raises(ValueError):
            root_from_path(leaves[i], i, n, [*tree.path(i), bytes(32)])
