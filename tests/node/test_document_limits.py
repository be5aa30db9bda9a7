"""What cannot be sent is refused when it is handed over.

A document no UMX-T frame can carry used to be accepted; the daemon then
tried to send it for ever, each try cutting the connection (the platform
refuses an oversize frame) for every other document. Now ``semq send`` and
``NodeClient.send``/``send_many`` refuse it at once, as they refuse a target
that is not an organization id or is the node itself; a well-formed target
the node has not heard of is accepted with a warning (the platform decides
whether it exists). The limit is computed in one place
(``semq.node.limits.max_document_size``) and checked here against a real
frame built at exactly the limit and one byte over."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    LK0,
    AppKey,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    LocalProtocolError,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
)
from tests._procs import Cluster, free_port, wait_until

A, B = "10008", "56001"
MAX_ID = "9" * 64  # the longest organization id: 64 digits


# ---------------------------------------------------------------- the limit


def _worst_frame(app_data_len: int) -> bytes:
    """A DATA frame as a relay delivers it, every field at its largest: the
    platform's 64-character id as the transport source, 64-digit target and
    origin, 255-byte AppKey parts, a session-key blob for 16 recipient keys,
    and AppData of ``app_data_len`` bytes (the sealed, signed document)."""
    from semq.node import limits as m

    key = AppKey(domain="d" * 255, data_type="t" * 255, subtype="s" * 255, key="k" * 255)
    body = Data(lk0=LK0(endpoint=Endpoint.org(MAX_ID), record_id=2**63 - 1), app_data=bytes(app_data_len),
                app_key=key, created_ms=1, encrypt=True, session_key=bytes(m.SESSION_KEY_BLOB_MAX))
    return encode_frame(Frame(kind=Kind.DATA, source=Endpoint.platform("p" * 64), target=Endpoint.org("8" * 64),
                              body=body))


def test_a_real_frame_at_exactly_the_limit_fits_and_one_byte_more_does_not() -> None:
    from semq.node import limits as m

    limit = m.MAX_DOCUMENT_SIZE
    assert limit == m.max_document_size() == DEFAULT_MAX_FRAME - 3484
    sealed = limit + m.GCM_TAG + m.CONTAINER_MAX  # what the document becomes
    frame = _worst_frame(sealed)
    assert len(frame) == DEFAULT_MAX_FRAME
    dec = FrameDecoder()
    dec.receive_data(frame)
    [raw] = list(dec)
    assert raw.kind is Kind.DATA and len(raw.frame().body.app_data) == sealed  # type: ignore[union-attr]
    del frame, raw
    over = _worst_frame(sealed + 1)
    assert len(over) == DEFAULT_MAX_FRAME + 1
    dec = FrameDecoder()
    with pytest.raises(RemoteProtocolError) as e:
        dec.receive_data(over)
        list(dec)
    assert e.value.code is ResultCode.FRAME_TOO_LARGE


def test_the_security_overheads_are_those_of_real_sealed_and_signed_documents() -> None:
    """The session-key blob for the most recipient keys, and the signed
    container of a document in the largest batch the path length allows."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    from semq.identity.crypto import MAX_RECIPIENT_KEYS, seal, sign_documents
    from semq.node import limits as m

    keys = [x25519.X25519PrivateKey.generate().public_key() for _ in range(MAX_RECIPIENT_KEYS)]
    n = 2**15 + 1  # a batch whose Merkle paths have 16 hashes (MAX_SIGN_BATCH = 2**16)
    body = b"the document"
    signed = sign_documents([(b"aad", body)] + [(b"aad", b"%d" % i) for i in range(n - 1)],
                            signing_key=ed25519.Ed25519PrivateKey.generate())
    container = signed[0].container
    assert len(container) - len(body) == m.CONTAINER_MAX == 626
    blob, ciphertext = seal(container, recipient_enc_public_keys=keys, aad=b"aad")
    assert len(blob) == m.SESSION_KEY_BLOB_MAX == 1558
    assert len(ciphertext) == len(container) + m.GCM_TAG
    # Without security nothing is added to the document.
    assert m.max_document_size(security=False) - m.MAX_DOCUMENT_SIZE == 1558 + 16 + 626


def test_accept_refuses_an_oversize_document_and_takes_one_at_the_limit(tmp_path: Path) -> None:
    from semq.node import limits as m

    limit = m.MAX_DOCUMENT_SIZE
    core = NodeCore(tmp_path / "n.sqlite", A, create=True, synchronous="OFF")
    try:
        ok = NewDocument(target=B, app_data=b"fine")
        with pytest.raises(LocalProtocolError) as e:
            core.accept([ok, NewDocument(target=B, app_data=bytes(limit + 1))])
        assert isinstance(e.value, m.DocumentTooLarge)
        assert str(e.value) == (f"document of {limit + 1} bytes exceeds the {limit}-byte limit for one document")
        assert e.value.code is ResultCode.FRAME_TOO_LARGE
        assert core.conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0  # nothing of the call
        (lk0,) = core.accept([NewDocument(target=B, app_data=bytes(limit))])
        assert core.conn.execute("SELECT length(app_data) FROM outbox WHERE id=?", (lk0.record_id,)).fetchone() \
            == (limit,)
    finally:
        core.close()


# ---------------------------------------------------------------- semq send


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str, prefix: str = "error: ") -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def node(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    assert run(capsys, "node", "init", "--dir", A, "--org", A, "--no-security",
               "--platform", f"127.0.0.1:{free_port()}")[0] == 0
    (tmp_path / "doc").write_bytes(b"<order/>")
    yield tmp_path


def outbox(root: Path) -> int:
    with NodeClient(root / A) as n:
        return len(n.messages())


def test_send_refuses_an_oversize_file_with_one_line(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file over the node's max_document_mib (files over large_from_mib
    travel as large documents: docs/large-documents.md)."""
    from tests._procs import set_config

    set_config(node / A, max_document_mib=60)
    big = node / "big.bin"
    with big.open("wb") as f:
        f.truncate(70_000_000)  # sparse: the size is what counts, and it is refused before it is read
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "X", str(big))
    assert rc == 2 and out == ""
    assert err == (f"error: {big}: document of 70000000 bytes (66.8 MiB) exceeds this node's limit of"
                   f" {60 << 20} bytes (60 MiB, max_document_mib)\n")
    assert outbox(node) == 0
    assert not (node / A / "large").exists()


def test_send_refuses_an_oversize_document_from_stdin(node: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.node.limits as mod

    monkeypatch.setattr(mod, "MAX_DOCUMENT_SIZE", 100)  # the check, without 64 MiB through a pipe
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * 101)))
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "X", "-")
    assert rc == 2 and out == ""
    one_line(err)
    assert "document of 101 bytes exceeds the 100-byte limit for one document" in err
    assert outbox(node) == 0


@pytest.mark.parametrize("to, words", [
    ("abc", '--to "abc" is not an organization id nor a user of this node'),
    ("", '--to "" is not an organization id'),
    ("a b", '--to "a b" is not an organization id'),
    ("0056001", '--to "0056001" is not an organization id'),
    ("bad id!", '--to "bad id!" is not an organization id'),
    (A, f"--to {A} is this node's own organization"),
])
def test_send_refuses_a_target_it_cannot_send_to(node: Path, capsys: pytest.CaptureFixture[str],
                                                 to: str, words: str) -> None:
    for extra in ([], ["--transactional"]):
        rc, out, err = run(capsys, "send", "--dir", A, "--to", to, "--type", "X", *extra, "doc")
        assert rc == 2 and out == ""
        line = one_line(err)
        assert words in line
        if to != A:  # it says what an organization id is
            assert "allowed: an organization id: a number of 1 to 64 digits" in line
    assert outbox(node) == 0


def test_send_to_an_organization_the_node_does_not_know_warns_and_accepts(
        node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warning = "warning: organization 56009 is not known to this node yet; the platform decides whether it exists"
    rc, out, err = run(capsys, "send", "--dir", A, "--to", "56009", "--type", "X", "doc")
    assert rc == 0 and out.startswith(f"{A}/1/1/")
    assert err.splitlines()[0] == warning and "accepted 8 bytes for 56009" in err
    # -q silences the note, not the warning
    rc, out, err = run(capsys, "send", "--dir", A, "--to", "56010", "--type", "X", "-q", "doc")
    assert rc == 0 and err == warning.replace("56009", "56010") + "\n"
    assert outbox(node) == 2
    # Once the node has sent to it, it knows it: no warning.
    rc, _, err = run(capsys, "send", "--dir", A, "--to", "56009", "--type", "X", "-q", "doc")
    assert rc == 0 and err == ""


def test_a_node_knows_organizations_from_certificates_and_documents(node: Path) -> None:
    with NodeClient(node / A) as n:
        assert not n.knows("77000")
        (node / A / "certs").mkdir()
        (node / A / "certs" / "77000.pem").write_text("")
        assert n.knows("77000")
        assert not n.knows("77001")
        n.core.conn.execute("INSERT INTO dedup (origin_type, origin_id, semq_id, semq_db_id, record_id, received_ms)"
                            " VALUES (1, '77001', 1, 1, 5, 0)")
        assert n.knows("77001")


def test_the_api_raises_the_same_errors(node: Path) -> None:
    from semq.node import limits as m

    with NodeClient(node / A) as n:
        with pytest.raises(m.DocumentTooLarge, match=r"document of \d+ bytes exceeds the \d+-byte limit for one"):
            n.send(B, bytes(m.MAX_DOCUMENT_SIZE + 1))
        with pytest.raises(m.BadTarget, match='target "abc" is not an organization id nor a user of this node;'
                                              ' allowed: an organization'):
            n.send("abc", b"x")
        with pytest.raises(m.BadTarget, match='target "a b" is not an organization id; allowed: an organization'):
            n.send("a b", b"x")
        with pytest.raises(LocalProtocolError, match=f"target {A} is this node's own organization"):
            n.send_many([dict(to=B, data=b"fine"), dict(to=A, data=b"to myself")])
        assert n.messages() == []  # nothing of a refused call


# ---------------------------------------------------------------- real processes


@pytest.mark.e2e
def test_an_oversize_document_is_refused_and_the_others_still_flow(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    from semq.node import limits as m

    limit = m.MAX_DOCUMENT_SIZE
    with NodeClient(cluster.root / A) as n:
        with pytest.raises(m.DocumentTooLarge) as e:
            n.send(B, bytes(70_000_000), data_type="HUGE")
        assert str(e.value) == f"document of 70000000 bytes exceeds the {limit}-byte limit for one document"
        with pytest.raises(m.DocumentTooLarge):
            n.send_many([dict(to=B, data=b"small", data_type="X"), dict(to=B, data=bytes(limit + 1))])
        sent = n.send_many([dict(to=B, data=b"doc %d" % i, data_type="ORDER") for i in range(20)])
    wait_until(lambda: len(cluster.inbox(B)) == 20, 30, "the 20 other documents in B's inbox")
    wait_until(lambda: cluster.settled([A, B]), 30, "all confirmed")
    assert sorted(cluster.inbox(B).values()) == sorted(b"doc %d" % i for i in range(20))
    assert {f"{A}/{lk.record_id}" for lk in sent} == set(cluster.inbox(B))
    # One session throughout: nothing cut the connection.
    log = (cluster.root / f"{A}.log").read_text()
    assert log.count("connected to platform") == 1, log[-2000:]
