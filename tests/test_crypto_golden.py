"""Golden vectors: the exact bytes of AADs, signed containers, sealed
documents and receipts, frozen from the implementation as of commit ecbb3fd
(before the per-document CPU work of issue 7/4). With the randomness pinned,
today's code must produce the same bytes (what it seals, the old code opens)
and must open and verify the frozen bytes (what the old code sealed, it
opens). Regenerate only for a deliberate, versioned format change:
``.venv/bin/python tests/test_crypto_golden.py`` prints the dictionary."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from semq.crypto import (
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

    def urandom(n: int) -> bytes:
        out = b""
        while len(out) < n:
            out += hashlib.sha256(b"golden %d" % next(counter)).digest()
        return out[:n]

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


def _aad(i: int, key: AppKey | None = None, save_fwd: SaveFwd = SaveFwd.MUST_DELIVER) -> bytes:
    return document_aad(LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3), A, B,
                        key or KEYS[i % len(KEYS)], save_fwd)


def _body(i: int) -> bytes:
    return b"body %d " % i * (i + 1)


def generate() -> dict[str, Any]:
    """Every vector, made by the code under test (randomness pinned)."""
    v: dict[str, Any] = {}
    v["aad"] = [_aad(i).hex() for i in range(3)]
    v["aad_unicode"] = document_aad(
        LK0(endpoint=Endpoint(node_type=NodeType.USER, node_id="user@ORG-A"), record_id=2**63 - 1), A, B,
        AppKey(domain="dömain", data_type="", subtype="x" * 10, key="ключ"), SaveFwd.DISCARD).hex()
    single = sign_document(_body(0), aad=_aad(0), signing_key=SIGN)
    v["single"] = [single.container.hex(), single.digest.hex()]
    batch = sign_documents([(_aad(i), _body(i)) for i in range(5)], signing_key=SIGN)
    v["batch"] = [[d.container.hex(), d.digest.hex()] for d in batch]
    blob, ct = seal(b"plain text", recipient_enc_public_keys=[k.public_key() for k in ENC],
                    aad=_aad(1))
    v["seal"] = [blob.hex(), ct.hex()]
    sealer = Sealer()
    prot = protect_documents([(_aad(i), _body(i), RECIPIENTS) for i in range(4)],
                             signing_key=SIGN, sealer=sealer)
    prot.append(protect_document(_body(4), aad=_aad(4), signing_key=SIGN, recipients=RECIPIENTS[:1],
                                 sealer=sealer))
    prot.append(protect_document(_body(5), aad=_aad(5), signing_key=SIGN, recipients=None))
    v["protected"] = [[p.app_data.hex(), p.session_key.hex(), p.digest.hex()] for p in prot]
    entries = [(LK0(endpoint=A, record_id=i + 1, semq_id=2, semq_db_id=3), bytes.fromhex(d))
               for i, (_, d) in enumerate(v["batch"])]
    v["receipt"] = make_receipt(entries[0][1], entries[0][0], SIGN, time_ms=TIME_MS).hex()
    br = make_batch_receipt(entries, SIGN, time_ms=TIME_MS)
    v["batch_receipt"] = br.hex()
    v["receipt_proofs"] = [p.hex() for p in receipt_proofs(br, entries)]
    return v


def test_today_produces_the_frozen_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    _pin_randomness(monkeypatch)
    assert generate() == GOLDEN


def _opened(open_fn: Callable[[bytes, bytes, bytes], bytes]) -> Iterator[bytes]:
    for i, (ct, blob, _) in enumerate(GOLDEN["protected"][:4]):
        yield open_fn(bytes.fromhex(blob), bytes.fromhex(ct), _aad(i))


@pytest.mark.parametrize("cached", [False, True])
def test_frozen_bytes_open_and_verify(cached: bool) -> None:
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
        blob, ct = (bytes.fromhex(x) for x in GOLDEN["seal"])
        for mine in (ENC, ENC[1:]):
            assert open_(blob, ct, recipient_enc_private_keys=mine, aad=_aad(1)) == b"plain text"
            assert Opener(mine).open(blob, ct, aad=_aad(1)) == b"plain text"
        for i, (ct_hex, blob_hex, d_hex) in enumerate(GOLDEN["protected"]):
            keys: Any = opener if i % 2 else ENC[:1]
            got = open_document(bytes.fromhex(ct_hex), bytes.fromhex(blob_hex), aad=_aad(i),
                                keys=keys, signer_certs=[SIGNER], cache=cache)
            assert (got.body, got.digest, got.encrypted) == (_body(i), bytes.fromhex(d_hex), i < 5)
            assert got.batch_size == (4 if i < 4 else 1)
            assert got.signer is SIGNER
        for got_pt in _opened(lambda b, c, a: open_(b, c, recipient_enc_private_keys=ENC[1:],
                                                    aad=a)):
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


GOLDEN: dict[str, Any] = {'aad': ['53454d512d4141442d76310001054f52472d4100020003000000000000000101054f52472d4101054f52472d42057472616465054f5244455202504f05533030303003',
         '53454d512d4141442d76310001054f52472d4100020003000000000000000201054f52472d4101054f52472d42057472616465054f5244455202504f05533030303103',
         '53454d512d4141442d76310001054f52472d4100020003000000000000000301054f52472d4101054f52472d42057472616465054f5244455202504f05533030303203'],
 'aad_unicode': '53454d512d4141442d763100030a75736572404f52472d41000100017fffffffffffffff01054f52472d4101054f52472d420764c3b66d61696e000a7878787878787878787808d0bad0bbd18ed18701',
 'batch': [['535144310256475aa75463474c0285df5dbf2bcab7a65e708bf319065a6e3e2635aae025961c1c1739f95f1077f02cb80692c3711e64b9d35530b1e23350010b9b728143d627c57c09950afed5c97d4921253309a8b20d3dc29be9f318bf0a40296e6bb70200000005000000000321249c694bea0fe2d28a38c251530a06543f5589ca3ed2782b314992d1e88cbd21664502b77d6154b692c61a9e8a278e81fb3f8629245e98d2836115a511c817ff2818a0393a184e224799fcf91c439399b105a9f92dc9954e4a4127c6598fdd00000007626f6479203020',
            'bf510963f3d96a41c0649fb10c9270b0cb8efcaa400f4eccead4ccd7514c37d9'],
           ['535144310256475aa75463474c0285df5dbf2bcab70c5442af192dd6d3145e17f5054734221c1c1739f95f1077f02cb80692c3711e64b9d35530b1e23350010b9b728143d627c57c09950afed5c97d4921253309a8b20d3dc29be9f318bf0a40296e6bb702000000050000000103a553a676e68264a0af7978bda18087b2eeb6ca28b34cf6f74aac7ab7f0447e0d21664502b77d6154b692c61a9e8a278e81fb3f8629245e98d2836115a511c817ff2818a0393a184e224799fcf91c439399b105a9f92dc9954e4a4127c6598fdd0000000e626f6479203120626f6479203120',
            'a82682bcfe1c45dd5df729745ab2a5a8bd6dddde78ac0c53c14f4fb6ed3aff9c'],
           ['535144310256475aa75463474c0285df5dbf2bcab717bd63ffea3e832838a9cbac289876841c1c1739f95f1077f02cb80692c3711e64b9d35530b1e23350010b9b728143d627c57c09950afed5c97d4921253309a8b20d3dc29be9f318bf0a40296e6bb70200000005000000020399593f4a98a60bc03869f1d5135762bf640949be3d43f15732f85f553b72d7cc5199c3b5f6070f65add278897a52737066c81638aeff8415d52f73835fb2ff21ff2818a0393a184e224799fcf91c439399b105a9f92dc9954e4a4127c6598fdd00000015626f6479203220626f6479203220626f6479203220',
            'ab2cfc9522e64f4b92f4e97cd4df64d45e90f8126e45b6be92700530e87c1d17'],
           ['535144310256475aa75463474c0285df5dbf2bcab7f4bb65ce671243325be1725a6e9a68841c1c1739f95f1077f02cb80692c3711e64b9d35530b1e23350010b9b728143d627c57c09950afed5c97d4921253309a8b20d3dc29be9f318bf0a40296e6bb70200000005000000030307db3a18e0b33c8a2eb703a1efc212f2101fd12a459bd4047f311b86377ecff75199c3b5f6070f65add278897a52737066c81638aeff8415d52f73835fb2ff21ff2818a0393a184e224799fcf91c439399b105a9f92dc9954e4a4127c6598fdd0000001c626f6479203320626f6479203320626f6479203320626f6479203320',
            'd2c7e10f02b4e5e830a2f3cea2df4719b7e0bb6428f1b838bcf49309388615a0'],
           ['535144310256475aa75463474c0285df5dbf2bcab76a6511456fedb4f2e959b6e339d0f55f1c1c1739f95f1077f02cb80692c3711e64b9d35530b1e23350010b9b728143d627c57c09950afed5c97d4921253309a8b20d3dc29be9f318bf0a40296e6bb7020000000500000004012fb4786fb3d105b302f6c40eaf52e456ba505366da744357f3200b9b200b3f5400000023626f6479203420626f6479203420626f6479203420626f6479203420626f6479203420',
            'ad71204a7052f38231f3b588bbfa5c116b45b53004f75de188e01c734b0e6998']],
 'batch_receipt': '535152310256475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a66',
 'protected': [['489998ecbc6fc08ae112ca5f421d35a87d5e37abfc5563acc7ee55f1f27ed22e4a6e1b21038cb9a1c78561fa1aa185a52c2f531b9fb631915f9729533ca45b04bd756bf26aad36b985cc1265be4c1723a581a63f66fb8d1a082a0fa6b2e63fcbaf824796ad6b1bbd4f49a36295a4ffbd80a40c11dc00778e7e5182920d5c3f14a83189624b14957f00ef88e557fc3cfdd464fbd64737b8ba9df214c9f89a5128afd9ae65cc00c12a5d6e427617af3ae859a1f586271d56d20fb4c45b55762c1c03b560b4955b42d68e',
                '53514b3101dcb11e9ed4812e55e273e59bfd907f9002a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d29df276a4fcf13361269d3b10936ef947404400651c220cb1a5dfc2545bc18b2ae29b66a3f50288a830668f44806718f67ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb552fe4163c602270d92e1be8c9bb544d9a60836e4268d8c05032aacf5ef7b2f5db6cc5a71cf7e4ce989a7965bc631a31b8b',
                '9785e1c4a8baeb5fbd7c6aad2bb0fb1d7af74321e82667c1d7dd10976def993a'],
               ['2ef82116767618e1757ff850b9a432d6f982d78f1c09563cdb52db22a484da0c60abf0bc2d69434905701e4bc0fa0c961bf35aeff84f959668a13a39962baf516ea0008fb1d89cdad9de8df25cc920ed7664bae567c486242e6a83861b2e76bd4b8e7e01d3c6581afd970d2d133e77d7edfb9c407e89560b712f1cff117d4d24d1e55028754f0e8703d9318c765d8a83fb7e3551799d10573a94703d501acff1627942177a55f4a83e9845740b8613c2ac9412319edf0a3b217e875ca94ec03bdd4bba8ce2350ec8b4ab8238e685fe2c',
                '53514b3101a5fb356867617bf185cc625394a9b51a02a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d29df276a4fcf13361269d3b10936ef947404400651c220cb1a5dfc2545bc18b2ae29b66a3f50288a830668f44806718f67ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb552fe4163c602270d92e1be8c9bb544d9a60836e4268d8c05032aacf5ef7b2f5db6cc5a71cf7e4ce989a7965bc631a31b8b',
                '6ccb5f2b110140dad95608d6069af0f5118d161fbbdcb55296a3313dcf41a8a1'],
               ['43c002f4c1b8745a7f399d1ed7f0f46edfba3b6afa1f6a6c203c16528c10b6467e0c034b3706c823a6920acd63a13bc5ccbd9550a9bb4ae715ffd2339c4d04f114961484c3c5a8bc669a6a836be4ff2a8a9f0b736df06581a4a6811f8252f8f66627fe24b5c01dd5a9770edfd85e4a9ef1e8fcf608b226d8871df4da08dd5cd3e4b60a570a7593fbf54f107d8ebe218c540ba82c2045f9c60c952fc78515a171a85c8e6d054ae85e099cbc643164605d25b6e6f52a9ff6326eab80837cc3fdc8d065f5aa4b115bedf255fa39b312ceab2e3f9cf08c94d1',
                '53514b31010d02e4fdd9d41c932ae12b198b3e307302a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d29df276a4fcf13361269d3b10936ef947404400651c220cb1a5dfc2545bc18b2ae29b66a3f50288a830668f44806718f67ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb552fe4163c602270d92e1be8c9bb544d9a60836e4268d8c05032aacf5ef7b2f5db6cc5a71cf7e4ce989a7965bc631a31b8b',
                'bcb18a921fa0b395d2c19ec27bcb9d3dff9ebf6f48dae73dd3476907e08635a8'],
               ['d8ae3da57b5759dc86e7d470b2242c6b9f8a873690e790b5c4c7840f8f7aec58db8ceeb9151b7cea48c937acde524625cd600ad35d6904b6b42f4d7674a07290c8d54ed426e096e649a6b9efce5effc61eb0e732c1d4440ea7e9acedf1003c3bf7c49ce01782b47687a16b4c97be3ef9e9f454e144f1f9851895df9f6dc6c6e92685cd7ed9682b24692e38fbc2e5a9b401cf7c06d80268be9968f316a03095c672415ad79d8ace5e355b8a6e6543d161e151dbb43254f159a1d709d992ce4d8fd4067ad7b3f4000e18997b2fecdffb46269a052660f4b9a17ece361e80ca',
                '53514b3101593a30f03ede6c968feba3915b86d58b02a0289810032eb417274eebc4a38e6899a674f6bfcca5f1160dafd61c4376f55285aa64a04886e241f0f9e35123ad963d29df276a4fcf13361269d3b10936ef947404400651c220cb1a5dfc2545bc18b2ae29b66a3f50288a830668f44806718f67ca2ffd6fe9efab3d76e37c34990a5af31e93e238061787d027b9418f18fd8ee8604e4fa932ca1abadb17edbdcbb552fe4163c602270d92e1be8c9bb544d9a60836e4268d8c05032aacf5ef7b2f5db6cc5a71cf7e4ce989a7965bc631a31b8b',
                'efeef310cf7655ab518c3386a9773684c167f73d8791a662584a1bcf2a4944a1'],
               ['c2a1ca26a660f915c413c6efee5a85257bf67cd47c379fa7c283fdfe517b0dcd560ddc87f83631734e0c69a2107fa5769db9c828f5be28b22a275d099df397ea9e2b0d57746a2e5989c9c026ad3e19bb5e126a507513d4c6f50d14d8a6e256b36e5d8b66b6bf569c748757dbbb7f9c9eac1b50646a50be4a0b12e6d80dd03adaa82b367ad86acd77aaf4e4ea556c9a45015bbd04123bfec6bc65af9b',
                '53514b3101e42397d4c7c9462b03c4c144ee77fac601a0289810032eb417274eebc4a38e6899ba2d719e53b6f681a28825144349592c560b2afb7a58935367d4516a4c9e7a69b14927241e5efaa596599c788860fbd3f899d49364d80518eb4670df33f68f7fddcae4461653ad46df7e807aa8c0c6bc',
                'be52c855662046eead18018d947ca357c96051cf7405e20b6eaaa6dd07e2a5bc'],
               ['535144310156475aa75463474c0285df5dbf2bcab7c830a19fdb5fc9d4931ff53036e3ad4411cd970e60cc5ce62f394680fa5f5369fb69d21ad04e6fed5e755d5ac0385ad35916302b4bf7449ea0bed13f0255edd6f3e4b983930ceed89d38e5a03b3f3f070000002a626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520626f6479203520',
                '',
                '4e19f81ff0b96dd5c55d004299bc0c8d08e5f43d57692cf0e38f1ee034b2ce89']],
 'receipt': '535152310156475aa75463474c0285df5dbf2bcab7000001a0c4506c7b84a3886325f95641607bead96a93e0bf21d652a4486fb44135f147286c84cbbc62fb01e9c92028c7a9141e77801f1d87abe26273b2590440b805deba3807a10901054f52472d41000200030000000000000001bf510963f3d96a41c0649fb10c9270b0cb8efcaa400f4eccead4ccd7514c37d9',
 'receipt_proofs': ['535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a6601054f52472d41000200030000000000000001bf510963f3d96a41c0649fb10c9270b0cb8efcaa400f4eccead4ccd7514c37d900000000033945cb643a013def93be31eb4a3c9b6332a0d9832c98bc23052640250e113085ca68ac9d06d1b5f1417dd428623a67f870735734d4c46105a18e868c5c6223a92a4e8341a73e28cb190f39d313b4c108e77e17986d421b573a56b641af47d045',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a6601054f52472d41000200030000000000000002a82682bcfe1c45dd5df729745ab2a5a8bd6dddde78ac0c53c14f4fb6ed3aff9c000000010350788e4c2c4a17a31151de7e114af210f93c6f9aa0b77d7ead002950c9b98136ca68ac9d06d1b5f1417dd428623a67f870735734d4c46105a18e868c5c6223a92a4e8341a73e28cb190f39d313b4c108e77e17986d421b573a56b641af47d045',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a6601054f52472d41000200030000000000000003ab2cfc9522e64f4b92f4e97cd4df64d45e90f8126e45b6be92700530e87c1d170000000203a95f9926204ac6d6d7ffe69d7acb60b8b29d17f4080bb00398338eb539e4c375b0e3e205f97675e57b0424461bf63a785241a07c0fb57effeeace6a427aed6bb2a4e8341a73e28cb190f39d313b4c108e77e17986d421b573a56b641af47d045',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a6601054f52472d41000200030000000000000004d2c7e10f02b4e5e830a2f3cea2df4719b7e0bb6428f1b838bcf49309388615a00000000303e6547b7c3e12ffcf2d59caa62a2a759398baa90e98e500bc8cc0cfbc9f754891b0e3e205f97675e57b0424461bf63a785241a07c0fb57effeeace6a427aed6bb2a4e8341a73e28cb190f39d313b4c108e77e17986d421b573a56b641af47d045',
                    '535152310356475aa75463474c0285df5dbf2bcab7000001a0c4506c7b3cf0b2bc776bf4533f87fff555d186e43bb88447105f6e85f400f1591d311f11a8a31fcfb25f63e367a2d1c6f2c1d093d536c7d403802a709b1a3b4671acf80b000000050569282b25f0a6a7db23db781006c612d42332fdb8e140c8555089db92507a6601054f52472d41000200030000000000000005ad71204a7052f38231f3b588bbfa5c116b45b53004f75de188e01c734b0e69980000000401328df7a92009372cf19ce658b95408b0e09eb7cb9dec818876213987b6dfb83d'],
 'seal': ['53514b310122772ae67f0fd9f0978de7d3f8d8163902a0289810032eb417274eebc4a38e689927bed7df1bf891df34ab21166507d3478bb3849195a991f92871ecbdb38a7c07ee52b60bde5e4874e9d0c10cb83104db3a8d4135d9941ebf885a54c6eaa82a2dcfad0df4ad3b38ee71ca3121cbc6c0f067ca2ffd6fe9efab3d76e37c34990a5a9c358d4166b928a40f40b5ae715bf07816fe8449a6787e5993a423f124ba087621920d776a39050c1a5c59e1e3241d3f05e0775288925bd347974fbe07e945814c0a2bf195366f0a27ede8808d2b4637',
          'b54b4c913f127d5eb80d3fd59b3528ffc3f0ae26a7f04407a11c'],
 'single': ['535144310156475aa75463474c0285df5dbf2bcab747bebd67e55d1ee90357a5ce22b270313a25aace3ba79a002c4544e052af55b5a603c9fb265a31173e4d2bbbf587201a636fcc85866a98e156714474d211d8f28c280bde1cfa9a324072dff54a4bdb0900000007626f6479203020',
            '45c6421734d9b0acc3d92094baf686cd20d4410ebb7da0156434f40c509b59a6']}


if __name__ == "__main__":
    import pprint

    mp = pytest.MonkeyPatch()
    _pin_randomness(mp)
    pprint.pprint(generate(), width=100)
    mp.undo()
