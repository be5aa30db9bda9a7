"""Whatever reaches the AS4 endpoint, the adapter either opens it or
refuses it with an ebMS error (EdgeRefusal): never another exception,
which the listener would turn into a bare 500 without the protocol's
answer (h11's invariant, for AS4)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semq.edge.as4 import AS4
from semq.edge.protocol import EdgeRefusal, Inbound
from tests.edge._as4kit import INVOICE, access_point, join, partner_of, split
from tests.edge._xmlsec_verify import verify_signal

A, B = access_point("POP000001"), access_point("POP000002")
OUT = AS4.build("fuzz/1", INVOICE, "application/xml", partner_of(A, B), A.keys)
SOAP, CID, ATT = split(OUT.headers, OUT.body)
LOOKUP = {A.party_id: partner_of(B, A)}.get


def _open(headers: dict[str, str], body: bytes) -> None:
    try:
        assert isinstance(AS4.read_inbound(headers, body, LOOKUP, B.keys), Inbound)
    except EdgeRefusal as refusal:
        assert refusal.reason.startswith("EBMS:") and refusal.body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(SOAP) - 1), st.integers(1, 64), st.binary(max_size=64))
def test_envelope_cut_and_spliced(at: int, cut: int, insert: bytes) -> None:
    _open(*join(SOAP[:at] + insert + SOAP[at + cut:], CID, ATT))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(ATT) - 1), st.binary(min_size=1, max_size=16))
def test_attachment_spliced(at: int, insert: bytes) -> None:
    _open(*join(SOAP, CID, ATT[:at] + insert + ATT[at + len(insert):]))


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=200), st.binary(max_size=2000))
def test_any_headers_and_body(content_type: str, body: bytes) -> None:
    _open({"Content-Type": content_type}, body)


@pytest.mark.parametrize("headers", [{}, {"content-type": OUT.headers["Content-Type"]},
                                     {"Content-Type": OUT.headers["Content-Type"] + "\r\nX: y"}])
def test_header_shapes(headers: dict[str, str]) -> None:
    _open(headers, OUT.body)


_INBOUND = AS4.read_inbound(OUT.headers, OUT.body, LOOKUP, B.keys)
_STATUS, _HEADERS, RECEIPT = AS4.receipt_for(_INBOUND, {}, partner_of(B, A), B.keys)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(RECEIPT) - 1), st.integers(0, 32), st.binary(max_size=32))
def test_receipt_cut_and_spliced_is_judged_never_raises(at: int, cut: int, insert: bytes) -> None:
    body = RECEIPT[:at] + insert + RECEIPT[at + cut:]
    result = AS4.read_receipt(200, _HEADERS, body, OUT, partner_of(A, B), A.keys)
    if result.ok:  # only what still verifies, checked on its own by libxmlsec1
        verify_signal(body, B.cert_pem)
    else:
        assert result.reason
