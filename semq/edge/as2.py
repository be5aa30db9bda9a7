"""AS2 (RFC 4130) as an edge protocol adapter, sans-IO.

Outbound: the document as a MIME part, optionally compressed (RFC 5402,
before signing), signed (multipart/signed, detached CMS, RFC 5751),
encrypted (CMS enveloped-data, AES-CBC), with a synchronous signed MDN
asked for; its MIC is the digest the MDN must return. Inbound: the same
layers opened in any order (decrypt, decompress, verify against the
partner's certificate), and a signed MDN (multipart/report,
message/disposition-notification, RFC 3798) answered. A message that does
not verify or open gets an MDN with an error disposition (HTTP 200, as RFC
4130 7.5.3 says); a request that is not AS2 from a known partner gets an
HTTP error, with nothing opened.

Partner options (``EdgePartner.options``), all text:

- ``sign``: ``sha256`` (default), ``sha384``, ``sha512`` or ``none``;
- ``encrypt``: ``aes256-cbc`` (default), ``aes128-cbc`` or ``none``;
- ``compress``: ``zlib`` or ``none`` (default);
- ``mdn``: ``signed`` (default) or ``unsigned``: what we ask for, and
  accept; an unsigned MDN is no proof and is accepted only when asked;
- ``key_transport``: how the content key is wrapped for the partner: ``rsa``
  (PKCS#1 v1.5, default), ``rsa-oaep`` (RSAES-OAEP SHA-256) or
  ``rsa-oaep-sha512``;
- ``encoding``: the encrypted body's transfer encoding, ``binary``
  (default, RFC 4130) or ``base64`` (for receivers that need it);
- ``require``: what a message from the partner must be, ``signed`` and/or
  ``encrypted`` (comma-separated; default: what we send it).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Callable, Mapping
from email.utils import formatdate
from typing import Final

from semq.edge.mime import (
    MimeError,
    decode_body,
    entity,
    media_type,
    param,
    split_entity,
    split_multipart,
)
from semq.edge.protocol import (
    PROTOCOLS,
    EdgePartner,
    EdgeRefusal,
    Inbound,
    OurKeys,
    Outgoing,
    ReceiptResult,
)
from semq.edge.smime import (
    KEY_TRANSPORTS,
    SmimeError,
    compress,
    decompress,
    decrypt,
    encrypt,
    encrypt_oaep,
    load_cert,
    sign_detached,
    verify_detached,
)
from semq.settings.bounds import EDGE_MAX_INFLATED

__all__ = ["AS2", "OPTIONS", "As2", "mdn_fields"]

#: option -> the values it takes (the first is the default)
OPTIONS: Final[dict[str, tuple[str, ...]]] = {
    "sign": ("sha256", "sha384", "sha512", "none"),
    "encrypt": ("aes256-cbc", "aes128-cbc", "none"),
    "compress": ("none", "zlib"),
    "mdn": ("signed", "unsigned"),
    "key_transport": ("rsa", "rsa-oaep", "rsa-oaep-sha512"),
    "encoding": ("binary", "base64"),
}
_MICALG: Final = {"sha256": "sha-256", "sha384": "sha-384", "sha512": "sha-512"}
_PKCS7_MIME: Final = ("application/pkcs7-mime", "application/x-pkcs7-mime")
_PKCS7_SIG: Final = ("application/pkcs7-signature", "application/x-pkcs7-signature")
_OK_DISPOSITION: Final = "automatic-action/mdn-sent-automatically; processed"
_MAX_LAYERS: Final = 4
_ENTITY_HEADERS: Final = ("content-type", "content-transfer-encoding", "content-disposition")
_MAX_ID: Final = 998  # a header line (RFC 5322)


def _opt(partner: EdgePartner, name: str) -> str:
    return partner.options.get(name, OPTIONS[name][0]).lower()


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return name


def _quote(name: str) -> str:
    """An AS2 name as a header value (quoted when it holds spaces, RFC 4130 6.2)."""
    if any(c in name for c in ' "\\'):
        return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return name


def _mic(data: bytes, micalg: str) -> str:
    algo = {"sha-256": "sha256", "sha-384": "sha384", "sha-512": "sha512", "sha1": "sha1"}[micalg]
    return f"{base64.b64encode(hashlib.new(algo, data).digest()).decode()}, {micalg}"


def _same_mic(a: str, b: str) -> bool:
    def norm(s: str) -> tuple[str, str]:
        value, _, alg = s.partition(",")
        alg = alg.strip().lower().replace("sha-1", "sha1")
        return "".join(value.split()), alg
    return norm(a) == norm(b)


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _boundary() -> str:
    return "----=_semq_" + secrets.token_hex(12)


def _signed(inner: bytes, micalg: str, ours: OurKeys) -> tuple[str, bytes]:
    """multipart/signed around a MIME entity: (its Content-Type, its body)."""
    sig = base64.encodebytes(sign_detached(inner, ours.cert_pem, ours.key_pem, micalg)).replace(b"\n", b"\r\n")
    b = _boundary()
    body = (f"--{b}\r\n".encode() + inner + f"\r\n--{b}\r\n".encode()
            + entity([("Content-Type", "application/pkcs7-signature; name=smime.p7s"),
                      ("Content-Transfer-Encoding", "base64"),
                      ("Content-Disposition", "attachment; filename=smime.p7s")], sig)
            + f"\r\n--{b}--\r\n".encode())
    return f'multipart/signed; protocol="application/pkcs7-signature"; micalg={micalg}; boundary="{b}"', body


def _verify_signed(content_type: str, body: bytes, partner: EdgePartner) -> tuple[bytes, str]:
    """The signed entity of a multipart/signed body, verified against the
    partner's certificate, and the digest's name."""
    parts = split_multipart(body, param(content_type, "boundary") or "")
    if len(parts) != 2:
        raise MimeError("a multipart/signed body must have two parts")
    sig_headers, sig_body = split_entity(parts[1])
    if media_type(sig_headers.get("content-type", "")) not in _PKCS7_SIG:
        raise MimeError("the second part of multipart/signed is no pkcs7-signature")
    if "content-transfer-encoding" not in sig_headers:
        sig_headers["content-transfer-encoding"] = "base64" if sig_body[:1] != b"\x30" else "binary"
    micalg = verify_detached(parts[0], decode_body(sig_headers, sig_body), load_cert(partner.their_cert_pem))
    return parts[0], micalg


def mdn_fields(block: bytes) -> dict[str, str]:
    """The fields of a message/disposition-notification body (lower-case names)."""
    headers, _ = split_entity(block.rstrip(b"\r\n") + b"\r\n\r\n")
    return headers


class As2:
    """The AS2 adapter (``PROTOCOLS["as2"]``)."""

    name = "as2"

    # ------------------------------------------------------------------ outbound

    def message_id(self, doc_id: str, partner: EdgePartner) -> str:
        host = "".join(c for c in partner.our_id if c.isalnum() or c in "-.") or "semq"
        return f"<semq-{doc_id}@{host[:64]}>"

    def build(self, doc_id: str, content: bytes, content_type: str, partner: EdgePartner, ours: OurKeys) -> Outgoing:
        filename = f"{doc_id}.dat"
        part = entity([("Content-Type", content_type), ("Content-Transfer-Encoding", "binary"),
                       ("Content-Disposition", f'attachment; filename="{filename}"')], content)
        sign, enc = _opt(partner, "sign"), _opt(partner, "encrypt")
        if _opt(partner, "compress") == "zlib":
            part = entity([("Content-Type", "application/pkcs7-mime; smime-type=compressed-data; name=smime.p7z"),
                           ("Content-Transfer-Encoding", "binary"),
                           ("Content-Disposition", "attachment; filename=smime.p7z")], compress(part))
        micalg = _MICALG.get(sign, "sha-256")
        if sign != "none":  # the MIC: over the signed entity (RFC 4130 7.3.1)
            mic = _mic(part, micalg)
            ctype, body = _signed(part, micalg, ours)
            inner = entity([("Content-Type", ctype)], body)
        else:  # over the entity encrypted, or, in the clear, over the content alone
            h, body = split_entity(part)
            ctype, inner = h["content-type"], part
            mic = _mic(part if enc != "none" else body, micalg)
        if enc != "none":
            oaep = KEY_TRANSPORTS.get(_opt(partner, "key_transport"))
            body = (encrypt_oaep(inner, partner.their_cert_pem, enc, oaep) if oaep
                    else encrypt(inner, partner.their_cert_pem, enc))
            ctype = "application/pkcs7-mime; smime-type=enveloped-data; name=smime.p7m"
        mdn_opts = ("signed-receipt-protocol=required, pkcs7-signature; signed-receipt-micalg=required, "
                    + micalg) if _opt(partner, "mdn") == "signed" else ""
        headers = {
            "AS2-Version": "1.2", "AS2-From": _quote(partner.our_id), "AS2-To": _quote(partner.id),
            "Message-ID": self.message_id(doc_id, partner), "Subject": f"SEMQ document {doc_id}",
            "Date": formatdate(usegmt=True), "MIME-Version": "1.0", "Content-Type": ctype,
            "Disposition-Notification-To": partner.our_id, "EDIINT-Features": "multiple-attachments",
        }
        if enc != "none":
            headers["Content-Transfer-Encoding"] = "binary"
            if _opt(partner, "encoding") == "base64":
                headers["Content-Transfer-Encoding"] = "base64"
                body = base64.encodebytes(body).replace(b"\n", b"\r\n")
            headers["Content-Disposition"] = "attachment; filename=smime.p7m"
        elif sign == "none":
            headers["Content-Disposition"] = f'attachment; filename="{filename}"'

        if mdn_opts:
            headers["Disposition-Notification-Options"] = mdn_opts
        return Outgoing(message_id=headers["Message-ID"], headers=headers, body=body, digest=mic)

    def read_receipt(self, status: int, headers: Mapping[str, str], body: bytes, sent: Outgoing,
                     partner: EdgePartner, ours: OurKeys) -> ReceiptResult:
        """A verified MDN: ``ok`` when it is positive and names our MIC;
        a verified negative one: not ok, with its proof (the document
        fails); anything else (no MDN, an HTTP error, a signature that does
        not verify): not ok and no proof (sent again)."""
        if status != 200:
            return ReceiptResult(False, f"HTTP {status} from the partner", b"")
        h = _lower(headers)
        ctype = h.get("content-type", "")
        proof = entity([("Content-Type", ctype)], body)
        try:
            if media_type(ctype) == "multipart/signed":
                report, _ = _verify_signed(ctype, body, partner)
                rh, rbody = split_entity(report)
                ctype = rh.get("content-type", "")
            elif _opt(partner, "mdn") == "signed":
                return ReceiptResult(False, "the partner's MDN is not signed", b"")
            else:
                rbody = body
            if media_type(ctype) != "multipart/report":
                return ReceiptResult(False, f"the partner's answer is no MDN ({media_type(ctype)})", b"")
            fields, text = None, ""
            for part in split_multipart(rbody, param(ctype, "boundary") or ""):
                ph, pb = split_entity(part)
                kind = media_type(ph.get("content-type", "text/plain"))
                if kind == "message/disposition-notification":
                    fields = mdn_fields(decode_body(ph, pb))
                elif kind == "text/plain" and not text:
                    text = decode_body(ph, pb).decode("utf-8", "replace").strip()[:300]
            if fields is None:
                return ReceiptResult(False, "the partner's MDN has no disposition", b"")
        except (MimeError, SmimeError) as e:
            return ReceiptResult(False, f"the partner's MDN does not verify: {e}", b"")
        if fields.get("original-message-id", "").strip() != sent.message_id:
            return ReceiptResult(False, "the partner's MDN names another message", b"")
        disposition = " ".join(fields.get("disposition", "").split())
        _, _, outcome = disposition.lower().partition(";")
        outcome = outcome.strip()
        if not outcome.startswith("processed") or "/error" in outcome or "/failure" in outcome:
            return ReceiptResult(False, f"the partner refused it: {disposition}" + (f" ({text})" if text else ""),
                                 proof)
        if not _same_mic(fields.get("received-content-mic", ""), sent.digest):
            return ReceiptResult(False, "the partner's MDN returns another MIC than the one sent", proof)
        return ReceiptResult(True, None, proof)

    # ------------------------------------------------------------------ inbound

    def claims(self, headers: Mapping[str, str]) -> bool:
        h = _lower(headers)
        return "as2-from" in h and "as2-to" in h

    def read_inbound(self, headers: Mapping[str, str], body: bytes,
                     partners: Callable[[str], EdgePartner | None], ours: OurKeys) -> Inbound:
        h = _lower(headers)
        sender, to = _unquote(h.get("as2-from", "")), _unquote(h.get("as2-to", ""))
        mid = h.get("message-id", "").strip()
        if not sender or not mid or len(mid) > _MAX_ID:
            raise EdgeRefusal("no AS2-From or Message-ID", 400, {"Content-Type": "text/plain"},
                              b"AS2-From and Message-ID are required\n")
        partner = partners(sender)
        if partner is None or partner.protocol != self.name or to != partner.our_id:
            raise EdgeRefusal(f"unknown AS2 partner {sender[:80]!r} or AS2-To {to[:80]!r}", 403,
                              {"Content-Type": "text/plain"}, b"unknown AS2 trading relationship\n")
        try:
            return self._open(h, body, partner, ours, mid)
        except (MimeError, SmimeError) as e:
            reason = str(e)
            if isinstance(e, _Insecure):
                code = "insufficient-message-security"
            elif isinstance(e, SmimeError) and ("decrypt" in reason or "encrypted" in reason):
                code = "decryption-failed"
            elif isinstance(e, SmimeError) and ("signature" in reason or "digest" in reason):
                code = "authentication-failed"
            else:
                code = "unexpected-processing-error"
            status, rh, rb = self._mdn(h, partner, ours, None, f"processed/error: {code}",
                                       f"The message was refused: {reason}")
            raise EdgeRefusal(f"{code}: {reason}", status, rh, rb) from None

    def _open(self, h: dict[str, str], body: bytes, partner: EdgePartner, ours: OurKeys, mid: str) -> Inbound:
        micalg = self._asked_micalg(h)
        current = entity([(k, v) for k, v in h.items() if k in _ENTITY_HEADERS], body)
        signed = encrypted = False
        mic: str | None = None
        for _ in range(_MAX_LAYERS):
            ph, pb = split_entity(current)
            ctype = ph.get("content-type", "text/plain")
            kind = media_type(ctype)
            if kind in _PKCS7_MIME:
                der = decode_body(ph, pb)
                smime = (param(ctype, "smime-type") or "").lower()
                if smime == "compressed-data":
                    current = decompress(der, EDGE_MAX_INFLATED)
                else:
                    current = decrypt(der, ours.cert_pem, ours.key_pem)
                    encrypted = True
                    if mic is None and not signed:
                        mic = _mic(current, micalg)
                continue
            if kind == "multipart/signed":
                current, _ = _verify_signed(ctype, pb, partner)
                if not signed:
                    mic = _mic(current, micalg)
                signed = True
                continue
            break
        else:
            raise MimeError(f"more than {_MAX_LAYERS} S/MIME layers")
        required = {r.strip() for r in partner.options.get("require", self._default_require(partner)).split(",")}
        if "signed" in required and not signed:
            raise _Insecure("the message is not signed")
        if "encrypted" in required and not encrypted:
            raise _Insecure("the message is not encrypted")
        ph, pb = split_entity(current)
        content = decode_body(ph, pb)
        if mic is None:
            mic = _mic(pb, micalg)
        disposition = ph.get("content-disposition")
        filename = param(disposition, "filename", "content-disposition") if disposition else None
        if filename:
            filename = filename.replace("\\", "/").rsplit("/", 1)[-1][:255] or None
        return Inbound(partner_id=partner.id, message_id=mid, content=content,
                       content_type=media_type(ph.get("content-type", "application/octet-stream")),
                       filename=filename, digest=mic)

    @staticmethod
    def _default_require(partner: EdgePartner) -> str:
        return ",".join(w for w, o in (("signed", "sign"), ("encrypted", "encrypt")) if _opt(partner, o) != "none")

    @staticmethod
    def _asked_micalg(h: dict[str, str]) -> str:
        opts = h.get("disposition-notification-options", "").lower()
        for clause in opts.split(";"):
            name, _, value = clause.partition("=")
            if name.strip() == "signed-receipt-micalg":
                for alg in (a.strip() for a in value.split(",")[1:]):
                    alg = {"sha256": "sha-256", "sha384": "sha-384", "sha512": "sha-512", "sha-1": "sha1"}.get(alg, alg)
                    if alg in ("sha-256", "sha-384", "sha-512", "sha1"):
                        return alg
        return "sha-256"

    def receipt_for(self, inbound: Inbound, headers: Mapping[str, str], partner: EdgePartner,
                    ours: OurKeys) -> tuple[int, dict[str, str], bytes]:
        h = _lower(headers)
        if "disposition-notification-to" not in h:
            return 200, {}, b""  # no MDN asked for
        return self._mdn(h, partner, ours, inbound.digest, "processed",
                         f"The message {inbound.message_id} was received and stored.")

    def _mdn(self, h: dict[str, str], partner: EdgePartner, ours: OurKeys, mic: str | None, outcome: str,
             text: str) -> tuple[int, dict[str, str], bytes]:
        mid = h.get("message-id", "").strip()[:_MAX_ID]
        fields = [("Reporting-UA", "SEMQ"), ("Original-Recipient", f"rfc822; {partner.our_id}"),
                  ("Final-Recipient", f"rfc822; {partner.our_id}"), ("Original-Message-ID", mid)]
        if mic is not None:
            fields.append(("Received-Content-MIC", mic))
        fields.append(("Disposition", f"automatic-action/MDN-sent-automatically; {outcome}"))
        b = _boundary()
        report = (f"--{b}\r\n".encode()
                  + entity([("Content-Type", "text/plain; charset=utf-8"), ("Content-Transfer-Encoding", "7bit")],
                           text.encode("ascii", "replace") + b"\r\n")
                  + f"\r\n--{b}\r\n".encode()
                  + entity([("Content-Type", "message/disposition-notification"),
                            ("Content-Transfer-Encoding", "7bit")],
                           b"".join(f"{k}: {v}\r\n".encode("ascii", "replace") for k, v in fields))
                  + f"\r\n--{b}--\r\n".encode())
        ctype = f'multipart/report; report-type=disposition-notification; boundary="{b}"'
        opts = h.get("disposition-notification-options", "").lower()
        body = report
        if "pkcs7-signature" in opts:
            ctype, body = _signed(entity([("Content-Type", ctype)], report), self._asked_micalg(h), ours)
        digest = hashlib.sha256(mid.encode("utf-8", "replace")).hexdigest()[:32]
        out = {"AS2-Version": "1.2", "AS2-From": _quote(partner.our_id), "AS2-To": _quote(partner.id),
               "Message-ID": f"<mdn-{digest}@semq>", "MIME-Version": "1.0", "Content-Type": ctype}
        return 200, out, body


class _Insecure(MimeError):
    """A message without the security the partner's agreement requires."""


AS2: Final = As2()
PROTOCOLS[AS2.name] = AS2
