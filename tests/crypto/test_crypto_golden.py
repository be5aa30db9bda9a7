"""Golden vectors: the exact bytes of AADs, signed containers, sealed
documents and receipts, frozen from the implementation as of commit ecbb3fd
(before the per-document CPU work on the hot path). With the randomness pinned,
today's code must produce the same bytes (what it seals, the old code opens)
and must open and verify the frozen bytes (what the old code sealed, it
opens). Regenerate only for a deliberate, versioned format change:
``.venv/bin/python tests/crypto/test_crypto_golden.py`` prints the dictionary."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from semq.identity.crypto import (
    NodeCertificate,
    Opener,
    Sealer,
    SignatureCache,
    _envelope,
    _signing,
    document_aad,
    key_id,
    make_batch_receipt,
    make_receipt,
    open_,
    open_document,
    protect_document,
    protect_documents,
    receipt_proofs,
    seal,
    sign_document,
    sign_documents,
    verify_batch_receipt,
    verify_document,
    verify_receipt,
)
from semq.identity.crypto._wire import encode_app_key, encode_endpoint, encode_lk0
from semq.umxt_protocol import LK0, AppKey, Endpoint, NodeType, SaveFwd

A, B = Endpoint.org("ORG-A"), Endpoint.org("ORG-B")
KEYS = [AppKey(domain="trade", data_type="ORDER", subtype="PO", key=f"S{i:04d}") for i in range(3)]
SIGN = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
ENC = [x25519.X25519PrivateKey.from_private_bytes(bytes(range(32 * i, 32 * i + 32)))
       for i in (1, 2)]
TIME_MS = 1_790_000_000_123


def _cert(org: str, sign: ed25519.Ed25519PublicKey, enc: x25519.X25519PublicKey) -> NodeCertificate:
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return NodeCertificate(org=org, serial=1, not_before=t, not_after=t + dt.timedelta(days=365),
                           signing_public_key=sign, encryption_public_key=enc,
                           signing_key_id=key_id(sign), encryption_key_id=key_id(enc),
                           certificate=None)  # type: ignore[arg-type]


SIGNER = _cert("ORG-A", SIGN.public_key(), ENC[0].public_key())
RECIPIENTS = [_cert("ORG-B", SIGN.public_key(), k.public_key()) for k in ENC]


def _pin_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic os.urandom (in _signing and _envelope) and ephemeral
    X25519 keys (in _envelope)."""
    counter = itertools.count()
    stream = bytearray()

    def urandom(n: int) -> bytes:
        # One deterministic byte stream: urandom(32) gives the same bytes as
        # urandom(16) twice, so how the code splits its reads does not matter.
        while len(stream) < n:
            stream.extend(hashlib.sha256(b"golden %d" % next(counter)).digest())
        out = bytes(stream[:n])
        del stream[:n]
        return out

    eph = itertools.count(100)

    def generate() -> x25519.X25519PrivateKey:
        return x25519.X25519PrivateKey.from_private_bytes(
            hashlib.sha256(b"ephemeral %d" % next(eph)).digest())

    fake_os = types.SimpleNamespace(urandom=urandom)
    fake_x = types.SimpleNamespace(X25519PrivateKey=types.SimpleNamespace(generate=generate),
                                   X25519PublicKey=x25519.X25519PublicKey)
    monkeypatch.setattr(_signing, "os", fake_os)
    monkeypatch.setattr(_envelope, "os", fake_os)
    monkeypatch.setattr(_envelope, "x25519", fake_x)


def _aad(i: int) -> bytes:
    """The associated data the signature and seal vectors were made over:
    the AAD's first layout ("SEMQ-AAD-v1": LK0, source, target, AppKey,
    SaveFwd), kept as fixed input bytes. Containers, envelopes and receipts
    take the AAD as an opaque input, so these vectors still freeze their
    formats; today's AAD layout is frozen by the "aad" vectors."""
    lk0 = LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3)
    return b"SEMQ-AAD-v1\x00" + encode_lk0(lk0) + encode_endpoint(A) + encode_endpoint(B) + encode_app_key(
        KEYS[i % len(KEYS)]) + bytes((int(SaveFwd.MUST_DELIVER),))


def _aad_now(i: int) -> bytes:
    """Today's layout ("SEMQ-AAD-v2"), with every bound header field set."""
    return document_aad(LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3), A, B, KEYS[i % len(KEYS)],
                        SaveFwd.MUST_DELIVER, flags=0x0E, priority=i, created_ms=TIME_MS + i,
                        expires_ms=TIME_MS + 60_000 if i else None)


def _body(i: int) -> bytes:
    return b"body %d " % i * (i + 1)


def generate() -> dict[str, Any]:
    """Every vector, made by the code under test (randomness pinned)."""
    v: dict[str, Any] = {}
    v["aad"] = [_aad_now(i).hex() for i in range(3)]
    v["aad_unicode"] = document_aad(
        LK0(endpoint=Endpoint(node_type=NodeType.USER, node_id="user@ORG-A"), record_id=2**63 - 1), A, B,
        AppKey(domain="dömain", data_type="", subtype="x" * 10, key="ключ"), SaveFwd.DISCARD,
        flags=0x1E, priority=9, created_ms=2**63 - 1, expires_ms=2**63 - 1).hex()
    single = sign_document(_body(0), aad=_aad(0), signing_key=SIGN)
    v["single"] = [single.container.hex(), single.digest.hex()]
    batch = sign_documents([(_aad(i), _body(i)) for i in range(5)], signing_key=SIGN)
    v["batch"] = [[d.container.hex(), d.digest.hex()] for d in batch]
    # Suite 1 (the session key format until suite 2): still made on request
    # (``suite=1``) and, above all, still opened.
    blob, ct = seal(b"plain text", recipient_enc_public_keys=[k.public_key() for k in ENC],
                    aad=_aad(1), suite=1)
    v["seal"] = [blob.hex(), ct.hex()]
    v["protected"] = _protected(Sealer(suite=1))
    entries = [(LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3), bytes.fromhex(d))
               for i, (_, d) in enumerate(v["batch"])]
    v["receipt"] = make_receipt(entries[0][1], entries[0][0], SIGN, time_ms=TIME_MS).hex()
    br = make_batch_receipt(entries, SIGN, time_ms=TIME_MS)
    v["batch_receipt"] = br.hex()
    v["receipt_proofs"] = [p.hex() for p in receipt_proofs(br, entries)]
    # Suite 2 (what nodes seal since): last, so the vectors above keep their
    # place in the pinned random stream.
    blob, ct = seal(b"plain text", recipient_enc_public_keys=[k.public_key() for k in ENC],
                    aad=_aad(1))
    v["seal_v2"] = [blob.hex(), ct.hex()]
    v["protected_v2"] = _protected(Sealer())
    return v


def _protected(sealer: Sealer) -> list[list[str]]:
    prot = protect_documents([(_aad(i), _body(i), RECIPIENTS) for i in range(4)],
                             signing_key=SIGN, sealer=sealer)
    prot.append(protect_document(_body(4), aad=_aad(4), signing_key=SIGN, recipients=RECIPIENTS[:1],
                                 sealer=sealer))
    prot.append(protect_document(_body(5), aad=_aad(5), signing_key=SIGN, recipients=None))
    return [[p.app_data.hex(), p.session_key.hex(), p.digest.hex()] for p in prot]


def test_today_produces_the_frozen_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    _pin_randomness(monkeypatch)
    assert generate() == GOLDEN


def _opened(open_fn: Callable[[bytes, bytes, bytes], bytes], name: str = "protected") -> Iterator[bytes]:
    for i, (ct, blob, _) in enumerate(GOLDEN[name][:4]):
        yield open_fn(bytes.fromhex(blob), bytes.fromhex(ct), _aad(i))


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("suite", [1, 2])
def test_frozen_bytes_open_and_verify(cached: bool, suite: int) -> None:
    seal_name, protected = ("seal", "protected") if suite == 1 else ("seal_v2", "protected_v2")
    cache = SignatureCache() if cached else None
    opener = Opener(ENC)
    for _ in range(2):  # the second round hits every cache
        c, d = (bytes.fromhex(x) for x in GOLDEN["single"])
        got = verify_document(c, aad=_aad(0), signer_certs=[SIGNER], cache=cache)
        assert (got.body, got.digest, got.batch_size) == (_body(0), d, 1)
        for i, (c_hex, d_hex) in enumerate(GOLDEN["batch"]):
            got = verify_document(bytes.fromhex(c_hex), aad=_aad(i), signer_certs=[SIGNER],
                                  cache=cache)
            assert (got.body, got.digest, got.batch_size) == (_body(i), bytes.fromhex(d_hex), 5)
        blob, ct = (bytes.fromhex(x) for x in GOLDEN[seal_name])
        assert blob[4] == suite
        for mine in (ENC, ENC[1:]):
            assert open_(blob, ct, recipient_enc_private_keys=mine, aad=_aad(1)) == b"plain text"
            assert Opener(mine).open(blob, ct, aad=_aad(1)) == b"plain text"
        for i, (ct_hex, blob_hex, d_hex) in enumerate(GOLDEN[protected]):
            keys: Any = opener if i % 2 else ENC[:1]
            got = open_document(bytes.fromhex(ct_hex), bytes.fromhex(blob_hex), aad=_aad(i),
                                keys=keys, signer_certs=[SIGNER], cache=cache)
            assert (got.body, got.digest, got.encrypted) == (_body(i), bytes.fromhex(d_hex), i < 5)
            assert got.batch_size == (4 if i < 4 else 1)
            assert got.signer is SIGNER
        for got_pt in _opened(lambda b, c, a: open_(b, c, recipient_enc_private_keys=ENC[1:],
                                                    aad=a), protected):
            assert got_pt.startswith(b"SQD1")


def test_frozen_receipts_verify() -> None:
    entries = [(LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3), bytes.fromhex(d))
               for i, (_, d) in enumerate(GOLDEN["batch"])]
    signer = [_cert("ORG-B", SIGN.public_key(), ENC[0].public_key())]
    for _ in range(2):
        info = verify_receipt(bytes.fromhex(GOLDEN["receipt"]), digest=entries[0][1],
                              lk0=entries[0][0], receiver_certs=signer)
        assert info.time_ms == TIME_MS
        info = verify_batch_receipt(bytes.fromhex(GOLDEN["batch_receipt"]), entries=entries,
                                    receiver_certs=signer)
        assert info.batch_size == 5
        assert [p.hex() for p in receipt_proofs(bytes.fromhex(GOLDEN["batch_receipt"]),
                                                entries)] == GOLDEN["receipt_proofs"]
        for (lk0, d), p in zip(entries, GOLDEN["receipt_proofs"], strict=True):
            info = verify_receipt(bytes.fromhex(p), digest=d, lk0=lk0, receiver_certs=signer)
            assert (info.lk0, info.digest, info.batch_size) == (lk0, d, 5)


GOLDEN: dict[str, Any] = {'aad': ['53454d512d4141442d76320001054f52472d4100020003000000000000000101054f52472d4101054f52472d42057472616465054f5244455202504f055330303030030e00000001a0c4506c7b0000000000000000',
         '53454d512d4141442d76320001054f52472d4100020003000000000000000201054f52472d4101054f52472d42057472616465054f5244455202504f055330303031030e01000001a0c4506c7c000001a0c45156db',
         '53454d512d4141442d76320001054f52472d4100020003000000000000000301054f52472d4101054f52472d42057472616465054f5244455202504f055330303032030e02000001a0c4506c7d000001a0c45156db'],
 'aad_unicode': '53454d512d4141442d763200030a75736572404f52472d41000100017fffffffffffffff01054f52472d4101054f52472d420764c3b66d61696e000a7878787878787878787808d0bad0bbd18ed187011e097fffffffffffffff7fffffffffffffff',
 'batch': [['535144310256475aa75463474c0285df5dbf2bcab793035cefbc9dbec45481df664778d16f45123300827d57488bbe84ae210c7502ad5ea6f6f344227ab90161553e98d15e69d3654ffc3264c7016502ea08475788bd3f2750c1250ca48bfe7e5a0d2f5c050000000500000000030fad1bc00d0053d9576bba230c60db4510091c5f21323b01b6b2b015764fa326b715d291ad6090f8c69b37ed1c186951c868cd8c6eaa281775101bbcc35a894a4a69de08803081013fda6a542cbf9008287f43ce80f9ad9d6d47743d3e5b741700000007626f6479203020',
            '4caa67af0353cc24d61deb18038f0a31c48ec42123183c6fce05f7de99cbd449'],
           ['535144310256475aa75463474c0285df5dbf2bcab7a65e708bf319065a6e3e2635aae0259645123300827d57488bbe84ae210c7502ad5ea6f6f344227ab90161553e98d15e69d3654ffc3264c7016502ea08475788bd3f2750c1250ca48bfe7e5a0d2f5c0500000005000000010346ca287188b6248ab02aaff7d046e15a89f88b01f58e946e9bc0ef830dc91b11b715d291ad6090f8c69b37ed1c186951c868cd8c6eaa281775101bbcc35a894a4a69de08803081013fda6a542cbf9008287f43ce80f9ad9d6d47743d3e5b74170000000e626f6479203120626f6479203120',
            'c3ca1c0adc575a3299d96c49453c4e7c8937b35e265d5b6ba0727e65fa460e27'],
           ['535144310256475aa75463474c0285df5dbf2bcab7bc6cce2467fe91e66b168a07a661c66d45123300827d57488bbe84ae210c7502ad5ea6f6f344227ab90161553e98d15e69d3654ffc3264c7016502ea08475788bd3f2750c1250ca48bfe7e5a0d2f5c050000000500000002030b2e202885be301eb2a233941820d1232cbd1400779b4ebf01b44a4e6c34893ac1b2c5331e2bcf6a3819f82d93c56f4ff7540caf34ac2f6782d54d0a96825a504a69de08803081013fda6a542cbf9008287f43ce80f9ad9d6d47743d3e5b741700000015626f6479203220626f6479203220626f6479203220',
            '8a8bc63af97f92ae264977c75426cd3811a8da2ff45a43225e223a9a43c6868c'],
           ['535144310256475aa75463474c0285df5dbf2bcab70c5442af192dd6d3145e17f50547342245123300827d57488bbe84ae210c7502ad5ea6f6f344227ab90161553e98d15e69d3654ffc3264c7016502ea08475788bd3f2750c1250ca48bfe7e5a0d2f5c050000000500000003035a1fa606e4e61c12874e56297d943f54aa8d9fa5142f63d01732b86fd9893b12c1b2c5331e2bcf6a3819f82d93c56f4ff7540caf34ac2f6782d54d0a96825a504a69de08803081013fda6a542cbf9008287f43ce80f9ad9d6d47743d3e5b74170000001c626f6479203320626f6479203320626f6479203320626f6479203320',
            '34e0893b81bad8488edeb1bdb88b792ccfd5ee6ca6afc1371b16fe73eb7c90e8'],
           ['535144310256475aa75463474c0285df5dbf2bcab7cbf0c28755e06cec9d60456f283099ac45123300827d57488bbe84ae210c7502ad5ea6f6f344227ab90161553e98d15e69d3654ffc3264c7016502ea08475788bd3f2750c1250ca48bfe7e5a0d2f5c05000000050000000401c326cc1ae80bc8b2da9b9e0e48e37d72a269f14c7ec23f431af6bb8203e96ddc00000023626f6479203420626f6479203420626f6479203420626f6479203420626f6479203420',
            '379e85571959eb5c7b173d069e008671193f2a71172d038bc35d36efa10d0f25']],
 'batch_receipt': '535152310256475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d',
 'protected': [['02a193fdaee612ce155806061daac1de12cdf4c045b8306a7507dcefe846fe848e3bd2e2be04e5a2cdd03520d520dc3158e4b2d275b6af2367fc2b0a587be0a47495305ed233181d05ffd3ce65aa5546c5d25384e8d2f1de4ea5a74c445ac87f9e7ef584f7e91b210188832ff01356c9e4cbeebaf52cfb426f6cd292ae9d4ca50094d02979f3415e77427c8f38a5c9e94a3f5c281c621f96253659d148c5c2091e208244f39f4afaaae0040dc13bdc6febe2fc12f705e78b656f356471798d2ae1a1b2ddeb687ec3b7',
                '53514b3101bdb737ae2eeb822a9936c177062cf4fd02a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d8a220793fc309ce26429ec459f5f294cd89b8f1683c26730123340bf97f0f6f03705ca26d8bccbec053970e0e306719167ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb5525dbc433fb1d8824697feb36f232d1f7ea4a92b365f8c42f822c24975a963b3f487173a192d7976d75292cbdc609e0a6c',
                'f987502a0316ae5e8b744cc003d86ca1e2adc95f7b3de386b5cede13c9c408b7'],
               ['da317a1ba6b3bdd42a6ad6739ff1718d2ac372b7910c7d8ff66a4d2c1c902aad4573c81425e544d00102593a514612949f59668ee300d14f0da54a838c803ffb380e52e5e76b5c304696ab2dc19934f592c7729b60346431ec3d1389e854b5906ac71fc4cd7adcae844cf9e9aada2058a715d55ff9fb7b7dd9836a7240d423b1b8125ebe183373ffc32a22b1cdb9b627dcf5129de7c553c7dd5c95f84416c6690621815f242c54dae60c04ff94cd0f780e5e5f4c18898fb939838c2cdaccca4202829b01be7df25411850d3ae846283a',
                '53514b3101767f05e2e50b0b34c3ebde339004686902a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d8a220793fc309ce26429ec459f5f294cd89b8f1683c26730123340bf97f0f6f03705ca26d8bccbec053970e0e306719167ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb5525dbc433fb1d8824697feb36f232d1f7ea4a92b365f8c42f822c24975a963b3f487173a192d7976d75292cbdc609e0a6c',
                '60ea068e560d5f6b881f86c2d82205a95945796b12ede9a508fd85dd699758f3'],
               ['1116eda3037fdaa3b8bd6c95589e7a44235c5280e44bab095b025199c0f15afbebd2227a95cab446c345f8c641246035e3ed94c7b87849155e8f649f084e808110990b4a1886eaffeb8e46c0f53f869e8a9a9416937a3dffbe00655a20435d60808e5fdae786d4fef6b73b9f5013c4254af2baad8b7d04453699fa95d30e22f8e8619c43ff6d8e9db615f30c15fcef2145d759c6d5ae97d1f7c02c22fd6660f02649cce95230e8925d15d181d264c3079c253f521368b518389661a9b982fe92b0dc33acc66e0ae3ba474842bdedfa70e38aa208e26b03',
                '53514b3101ff7d337077ee4bbfe01b904452b7c60c02a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d8a220793fc309ce26429ec459f5f294cd89b8f1683c26730123340bf97f0f6f03705ca26d8bccbec053970e0e306719167ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb5525dbc433fb1d8824697feb36f232d1f7ea4a92b365f8c42f822c24975a963b3f487173a192d7976d75292cbdc609e0a6c',
                'bcc015746a2e6e1125b7d79ae904ff8a6589beae8b842b9131fbfa2cbcca741d'],
               ['faba54d549ab492b84cc6525da2c6378569a835a5081c0aa2c7be7abd40464e6a4490c58c060f4d3dc5031dd6444098c59edda77b834e2b89a91051097c3f18484445c0e273dd020b062aa64e4b30615f2995c6017989fb397e8012be426f235a1e4c441e6a6dcbdc520500a1de7ea6e114db0dd87f0422591bc8ed958eab822696a7dd756e55e2754b69b27452742381666383deefdfc2a89f9db7300d888e797f8c06ab907eda39d09f9820dd936ffcb4f19780d80e628914d3cefd656130062ce1a198bbf3996cbfe704835b650949444b73bd7173421d837ac7749ea',
                '53514b3101102169a19cf1d70ebee6bfcf1a811bed02a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d8a220793fc309ce26429ec459f5f294cd89b8f1683c26730123340bf97f0f6f03705ca26d8bccbec053970e0e306719167ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb5525dbc433fb1d8824697feb36f232d1f7ea4a92b365f8c42f822c24975a963b3f487173a192d7976d75292cbdc609e0a6c',
                'fb74b86f96f55da781957beea5164c8f71986f6b0f447808e2eee2a54479946e'],
               ['6d4e7c402ba86cfc31def37915090dca13626a0b9c996880634f79c61a13ce1e7c63434fc6aa5bdfd3c9253a6f9e92ef44e2136463c37f3ff369497324a967d5afc3bf6adea118d365fccc807c0764e4ed1fc7ad12398ca1e32ba1c251b9bf7eca3298893186eca684692f1455ca337fd3ad8138e8fa66dfdb94fe6841fdd0ce8d2810d98e51fd40deca238e42778007103221d8b90d2a865cfd1ea5',
                '53514b3101245e718c193ffcbcaf5d1339314b8d5101a0289810032eb417274eebc4a38e6899ba2d719e53b6f681a28825144349592c560b2afb7a58935367d4516a4c9e7a69273df0717aa555ed3fdf0bcd5cd9f773ac0cbef4b56a426ab9b6db8e87dfa2d72decdb7309bda353242a97acd68bf479',
                '2f0b9f04dcf928f88d09a6c7fe00b1bee476f48087200b00962eaf392658a704'],
               ['535144310156475aa75463474c0285df5dbf2bcab734a2c4a6a7088475668888577d0d2fdf02fc7bd99b25acac4c2eafe96630da55b8872ec1145351ea6ce1c5ed6e37b5a70af09ce3aa7133bab215ebaffdccffd0aad1e26ee4e6b7ee279241f843bc44050000002a626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520',
                '',
                'cddc6262dc5ffd4c22f6059af3d70fd2cf52ec72477841d28155f2c9752a8e3b']],
 'protected_v2': [['94e678ef8e014e7c2fed9406dbb3b26a3c9645636c05dcd4c98146668307aacbab0cd80dba6eabc7bd0f660308ac0462205dc6a3879e3b16a459bdcec46a753aef2cef969ccf83810ec8c1a083d8018d79d6a5bf7fe47168971c65402f5edcb69c6a3f01d23d84856b6b12cf7c34b89d116cde8162be0456ed6c5145bb37a1c3ad3400d14dbe8128db5eb81145001dbf4a43abffdd897cc5d9e456d39fd0122438d04409d28ead301a42b4ba5aca53509cadb25510120fae770a177051a1da61c06f95234b8178b15f',
                   '53514b3102feec6e57e90219ac82875d60e93c619f02a0289810032eb417274eebc4a38e68996b16a931c8d5cb472a092a81365a59a2dd5a08e917145e3e318e554b8b3d002b8d60404394a5dac005b802696431004c094105732ac679c876fcfb855200e641e7eea170bc33d57c3a48c78191e09ac967ca2ffd6fe9efab3d76e37c34990a5a56d39d7842e5596f827a755736ff2997810811770c4cbe141e21debc86f4b8285d507ea90a61861c1cb02f119fde9b8ca849f2483adba387b2315122a99c06ddffa734e6dc414bb847c5d5b246c45198',
                   '1b0a9b8aa1d486602bf738e54a452252ca19973e74d42e223cd523e56d0e9acc'],
                  ['fe726a743688fc109adc89cb09bd6d33dcd18e886677af44a31265213ac596f1a33cd1a11f5e5b6aac2899f7d37ad45b05bfb58ab575f6525c992a1fcf0cbc63f299a3eaa9fe82f147f87a100509efb9fb07474f2c02bec567e7a14144620caf3a9a7a0aed0751af6f07b9d5b357e87acd9b34ca1c1325b236170bd6c9c2536c1088e18d8467a1ecedc0f72b88b084293caa7615e13536c1eff234e6c4c128f1171356d2685b9b3fbfe122d605fa830a2f6379ed1385fdac2d3ef63c25a5da0e006dab9485c3dde73fc77fd31ea8b0c5',
                   '53514b3102c3dc518a2ec42b445c9001dc04bbd0a702a0289810032eb417274eebc4a38e68996b16a931c8d5cb472a092a81365a59a2dd5a08e917145e3e318e554b8b3d002b8d60404394a5dac005b802696431004c094105732ac679c876fcfb855200e641e7eea170bc33d57c3a48c78191e09ac967ca2ffd6fe9efab3d76e37c34990a5a56d39d7842e5596f827a755736ff2997810811770c4cbe141e21debc86f4b8285d507ea90a61861c1cb02f119fde9b8ca849f2483adba387b2315122a99c06ddffa734e6dc414bb847c5d5b246c45198',
                   '7f500f8cd2864857c5b5091616d044e66ad069f7b76953ed670bccd811103bf9'],
                  ['347fec2e6bc05a9a37dad9ce66b5919566fad748aa8922ca72aabf021688eb488b0a5d5e1cbe8fa5e449830a9c06fabffe5ca9b9f892c3627432837efc774ef9073e4981276272ec229971a9573455a0d06ed6fd7cd5a3339d663de7c8e73f102d4404d5e83d90bdb47547a7416b4549cc8b3c4d5dd76645e5d338f52d29953d4ea831ca36baac53caa1e5c94dff141bb268c9853f21b4836dd32ccc70447963c03ddc2fd34bfbaaba81e2bf4bf67951a9483ac70a7f408d7095a8fdb68158bcc528412f05fa175726d6d43f532b956b1a2ee351b883bc',
                   '53514b3102298caa1a59578788df6d17b86b9b852d02a0289810032eb417274eebc4a38e68996b16a931c8d5cb472a092a81365a59a2dd5a08e917145e3e318e554b8b3d002b8d60404394a5dac005b802696431004c094105732ac679c876fcfb855200e641e7eea170bc33d57c3a48c78191e09ac967ca2ffd6fe9efab3d76e37c34990a5a56d39d7842e5596f827a755736ff2997810811770c4cbe141e21debc86f4b8285d507ea90a61861c1cb02f119fde9b8ca849f2483adba387b2315122a99c06ddffa734e6dc414bb847c5d5b246c45198',
                   '7876730201ca24be302ab02e55cfb864cdfd85bd36321b531ca7fe562c344a08'],
                  ['8376c9827eb4e3ba4aebd23712f42370e2ee9abd183a6a013618086bceacf44e3e4063505e5987804bc31f3f567538b677b7def13c9f6d7ecbe42383c75eda22e60b8803529adbe6c91e3f123c1ff5996021f8a68fc41be2ba58f1785860f129e69d4ae6b2f9df9e27cbd8681dc6571c75d6565fb11c5634d12d14f11f4f7d9c415789c4ee9bc4b38035a4b7d916432936c29f9d534021553231f6e196f08476e5057a1d6604e145182a6c9fec007dc0002896273b289e1c5940d8b0cde0be1b6e7cfd5acb2e1d8de6ca997d055861532274246378213218708f58863adf',
                   '53514b310203faf2f2f0a729f9dc3ef02312dbc68c02a0289810032eb417274eebc4a38e68996b16a931c8d5cb472a092a81365a59a2dd5a08e917145e3e318e554b8b3d002b8d60404394a5dac005b802696431004c094105732ac679c876fcfb855200e641e7eea170bc33d57c3a48c78191e09ac967ca2ffd6fe9efab3d76e37c34990a5a56d39d7842e5596f827a755736ff2997810811770c4cbe141e21debc86f4b8285d507ea90a61861c1cb02f119fde9b8ca849f2483adba387b2315122a99c06ddffa734e6dc414bb847c5d5b246c45198',
                   'd338faf37cd01d01fbce7b7600acbcc291e73980653c10cc0dc73fde31647ed7'],
                  ['9967ce4d361ae73c3cceac7e47bafd2c8e181dbecfd79f427d01b85207cb4b1e6ed80b0bb51d5a996b85394ce7bdd9262515fed933ede14b89657fe90a924a2a71903c302f540eb4155c568851ce4c01ff93232f40e847c7d703cf1907fe19a2e50a62e2fc9d3368f388c54f87f1526c7f8029f1bc4fec1c3aae181ed861a940bfcdf05df21a11b64274d7f86ab74fc2cbf6ca3dbba9513dbaca4539',
                   '53514b3102c830a19fdb5fc9d4931ff53036e3ad4401a0289810032eb417274eebc4a38e6899f0e698070620bcf7841a54517232f2c4ac385dd556a5af762064ed07662c357666b93458184641eca26e0d71b7423eeff4f0702d57980e143fa63781c133a88c91d5875dcb1b397d52b706dc0ca12a56',
                   'e2d94ee6eacbe5b3411ea5d336c684456cb2aeb34ef19a71e139045e4b547931'],
                  ['535144310156475aa75463474c0285df5dbf2bcab7f6fd5459e84419760791511dd5b2378cecaa7c9a0ec1a272445bfed7d117828a2dda5a1dc5fb35b2c413353d0c8ec8753be5a0d235846588ce20f07b81abc50be388b4a1cc4a7cbbcde32ef7b568c9040000002a626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520',
                   '',
                   '435015acc4b01b5814981f65809ab66084295b7c9865b2bfc0b9b800d3e5f2de']],
 'receipt': '535152310156475aa75463474c0285df5dbf2bcab7000001a0c4506c7b19f57ba25b67d8a52455c16cb8af90136a0a9e237e946157011ffffb5782ee4eb526020c3011e34537f0ac652ec9113e8d8b4ab9010d60540a79fa6d98828d0901054f52472d410002000300000000000000014caa67af0353cc24d61deb18038f0a31c48ec42123183c6fce05f7de99cbd449',
 'receipt_proofs': ['535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d01054f52472d410002000300000000000000014caa67af0353cc24d61deb18038f0a31c48ec42123183c6fce05f7de99cbd4490000000003dc3f52a77970110ec43feb11a4f5aff9c72fdda0fc3cdef94973ec0e7de489d8e43f67e07e75282560752565c2e9f586a8906442389c02957ea0cd82e4017b306e972d1a69ffdce3252b03b498c4005f0fea9367232238dd8d14ed2551730b16',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d01054f52472d41000200030000000000000002c3ca1c0adc575a3299d96c49453c4e7c8937b35e265d5b6ba0727e65fa460e2700000001038a300f3f01b7e5922f8212632587d4c6f4b0d1518e24674ad857b2f1d2cb972de43f67e07e75282560752565c2e9f586a8906442389c02957ea0cd82e4017b306e972d1a69ffdce3252b03b498c4005f0fea9367232238dd8d14ed2551730b16',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d01054f52472d410002000300000000000000038a8bc63af97f92ae264977c75426cd3811a8da2ff45a43225e223a9a43c6868c000000020319e9b9b6d4045754556b72b44bd786deb3ef644480729cbb54b8c0fb88d98f5f3b203f3d1ae8b97fe48b42f76d395b21259e040dba1c4f982861c1dea4fb109f6e972d1a69ffdce3252b03b498c4005f0fea9367232238dd8d14ed2551730b16',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d01054f52472d4100020003000000000000000434e0893b81bad8488edeb1bdb88b792ccfd5ee6ca6afc1371b16fe73eb7c90e8000000030344be6b2f5e06f3b84b4629f7ee647f30cdce011b82ec576b30a6c10214d666263b203f3d1ae8b97fe48b42f76d395b21259e040dba1c4f982861c1dea4fb109f6e972d1a69ffdce3252b03b498c4005f0fea9367232238dd8d14ed2551730b16',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b2357d53c897c305bac2d76dde62d6952e765cab48c112bec26cbd4d8a515681e5e404839c3e3be521225f7aa9fa611576581ca7d0c30bc6cdac25f35a7b2cb0b000000058bb8d936f3514031e942b7398a2706649f6adc6a23a7262a365e51f2d81e812d01054f52472d41000200030000000000000005379e85571959eb5c7b173d069e008671193f2a71172d038bc35d36efa10d0f25000000040177705f96dd36d048e596e0ebd8c9210c33a43d26829c79e229f8da8c5dacfd6e'],
 'seal': ['53514b3101f4bb65ce671243325be1725a6e9a688402a0289810032eb417274eebc4a38e689927bed7df1bf891df34ab21166507d3478bb3849195a991f92871ecbdb38a7c0799ba7640bb5a43b66c3d610b6475b5df334d4d0fe7f3d212255d5025eae419b4b34fa925da0378c1b9c915acceb71c6d67ca2ffd6fe9efab3d76e37c34990a5a9c358d4166b928a40f40b5ae715bf07816fe8449a6787e5993a423f124ba0876567acd3c0f3d0ece9fb1f9e63f60ac3b0c207b68b6f5977eea904b5d07a57618975670de61a8f585d69d5a75fc046dcb',
          '9178be8b7030ef9c0d9dd46d1dc326f24240bd10a426fb824727'],
 'seal_v2': ['53514b3102dcb11e9ed4812e55e273e59bfd907f9002a0289810032eb417274eebc4a38e6899c6e7278fe823ec5a5909ac37d8eedbf3a0ccae1932826fc398f7d3b19f6bc146a257f34179fb9e5343d9126b32918e1dc55696ff6959404a57a3d8da4bc8f24a05b5f249b9f009dfd8e8f6db718a977267ca2ffd6fe9efab3d76e37c34990a5a11db1236bfdd719fac333f058bc5853a29e541a7c61f669734283d8914fced7455a1bd0e9bf4acf67379f4c352e0f19a210436d359339f97d7c1f726c79d17e7d80d57a5dbcd0d1b33884e9086ee89e8',
             '1b088a33b2dc48e48cb2adf448dc6e4f5acd5a0ff37d024b631c'],
 'single': ['535144310156475aa75463474c0285df5dbf2bcab747bebd67e55d1ee90357a5ce22b270313a25aace3ba79a002c4544e052af55b5a603c9fb265a31173e4d2bbbf587201a636fcc85866a98e156714474d211d8f28c280bde1cfa9a324072dff54a4bdb0900000007626f6479203020',
            '45c6421734d9b0acc3d92094baf686cd20d4410ebb7da0156434f40c509b59a6']}


if __name__ == "__main__":
    import pprint

    mp = pytest.MonkeyPatch()
    _pin_randomness(mp)
    pprint.pprint(generate(), width=100)
    mp.undo()
