"""Frames as a core receives them: encoded, then read back by the stream
decoder (``RawFrame``), as the daemons hand them over."""

from __future__ import annotations

from semq.umxt_protocol import Frame, FrameDecoder, RawFrame, encode_frame


def decoded(data: list[bytes] | bytes) -> list[RawFrame]:
    """The frames in encoded bytes."""
    dec = FrameDecoder()
    dec.receive_data(data if isinstance(data, bytes) else b"".join(data))
    return list(dec)


def raws(*frames: Frame) -> list[RawFrame]:
    """These frames, encoded and read back."""
    return decoded([encode_frame(f) for f in frames])


def raw(frame: Frame) -> RawFrame:
    """One frame, encoded and read back."""
    (got,) = raws(frame)
    return got
