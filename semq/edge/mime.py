"""The few MIME rules the edge needs (RFC 2045, 2046), over bytes, sans-IO.

Signatures are over exact bytes, so nothing here re-serializes a part: a
multipart body is cut at its delimiters and each part is kept as it came."""

from __future__ import annotations

import base64
import binascii
import quopri
import re
from email.message import Message
from typing import Final

__all__ = [
    "MAX_HEADER_BYTES",
    "MimeError",
    "decode_body",
    "entity",
    "media_type",
    "param",
    "split_entity",
    "split_multipart",
]

#: the header block of one MIME part
MAX_HEADER_BYTES: Final = 64 * 1024
_TOKEN: Final = re.compile(rb"^[!-9;-~]+$")


class MimeError(Exception):
    """A MIME structure that does not parse."""


def _message(content_type: str) -> Message:
    m = Message()
    m["content-type"] = content_type
    return m


def media_type(content_type: str) -> str:
    """``type/subtype`` in lower case."""
    return _message(content_type).get_content_type()


def param(value: str, name: str, header: str = "content-type") -> str | None:
    """A parameter of a structured header (Content-Type, Content-Disposition)."""
    m = Message()
    m[header] = value
    got = m.get_param(name, header=header)
    if got is None or isinstance(got, tuple):  # (RFC 2231's encoded form: not used by AS2)
        return None
    return str(got).strip('"')


def split_entity(data: bytes) -> tuple[dict[str, str], bytes]:
    """A MIME entity's headers (names in lower case, folded lines joined)
    and its body."""
    end = data.find(b"\r\n\r\n")
    sep = 4
    lf = data.find(b"\n\n")
    if lf >= 0 and (end < 0 or lf < end):
        end, sep = lf, 2
    if data.startswith((b"\r\n", b"\n")):  # no headers at all
        return {}, data[2 if data.startswith(b"\r\n") else 1:]
    if end < 0:
        raise MimeError("a MIME part has no end of headers")
    if end > MAX_HEADER_BYTES:
        raise MimeError(f"a MIME part's headers are over {MAX_HEADER_BYTES} bytes")
    headers: dict[str, str] = {}
    last = None
    for raw in data[:end].replace(b"\r\n", b"\n").split(b"\n"):
        line = raw.decode("latin-1")
        if line[:1] in (" ", "\t") and last is not None:
            headers[last] += " " + line.strip()
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name.encode("latin-1")):
            raise MimeError(f"a MIME header line does not parse: {line[:60]!r}")
        last = name.strip().lower()
        headers[last] = value.strip()
    return headers, data[end + sep:]


def entity(headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A MIME entity's bytes: its header lines, a blank line, its body."""
    return b"".join(f"{k}: {v}\r\n".encode("ascii") for k, v in headers) + b"\r\n" + body


def split_multipart(body: bytes, boundary: str) -> list[bytes]:
    """The parts of a multipart body, each exactly as it came (the line
    break before a delimiter belongs to the delimiter)."""
    if not boundary or len(boundary) > 200:
        raise MimeError("a multipart part has no usable boundary")
    delim = b"--" + boundary.encode("latin-1")
    if body.startswith(delim):
        pos = 0
    else:
        i = body.find(b"\n" + delim)
        if i < 0:
            raise MimeError("a multipart body has no delimiter")
        pos = i + 1
    parts: list[bytes] = []
    while True:
        after = pos + len(delim)
        if body[after:after + 2] == b"--":
            return parts
        line_end = body.find(b"\n", after)
        if line_end < 0:
            raise MimeError("a multipart body ends inside a delimiter line")
        start = line_end + 1
        nxt = body.find(b"\n" + delim, start)
        if nxt < 0:
            raise MimeError("a multipart body has no closing delimiter")
        stop = nxt - 1 if nxt > start and body[nxt - 1:nxt] == b"\r" else nxt
        parts.append(body[start:stop])
        pos = nxt + 1
        if len(parts) > 64:
            raise MimeError("a multipart body has over 64 parts")


def decode_body(headers: dict[str, str], body: bytes) -> bytes:
    """A part's body under its Content-Transfer-Encoding."""
    cte = headers.get("content-transfer-encoding", "binary").strip().lower()
    if cte == "base64":
        try:
            return base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise MimeError("a base64 part does not decode") from None
    if cte == "quoted-printable":
        return quopri.decodestring(body)
    if cte in ("binary", "8bit", "7bit"):
        return body
    raise MimeError(f"unknown Content-Transfer-Encoding {cte[:40]!r}")
