"""Request lines of the admin console and the user socket, buffered within
a limit (sans-IO: bytes in, lines out; the trio shell is semq.ops.admin).

``LineBuffer`` holds what a connection sent and was not consumed yet, and
never more than ``limit + 1`` bytes (a line of at most ``limit`` bytes and
its newline): the shell asks the socket for at most ``room()`` bytes, so a
peer that streams without a newline costs one buffer of the limit, then an
error. ``next_line`` scans only the bytes that came since its last scan: a
peer that drips a line a byte at a time costs time linear in the bytes,
not quadratic (h2's frame buffer: check the length against the limit
before waiting for more, parse only whole units).

The limit may be raised between lines (the user socket's first line is
short: it authenticates; later ones may carry a document's block).
"""

from __future__ import annotations

__all__ = ["LineBuffer", "LineTooLong"]


class LineTooLong(Exception):
    """More than ``limit`` bytes came without a newline: the peer's fault.
    ``size`` is how many were buffered when it was seen (at most
    ``limit + 1``: nothing more was read)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes without a newline exceed the {limit}-byte limit of a line")
        self.size = size
        self.limit = limit


class LineBuffer:
    """The unconsumed bytes of one connection: ``feed`` what the socket
    gave (at most ``room()`` bytes), then take ``next_line()`` until it
    returns None."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"line limit {limit} is not a positive number of bytes")
        self.limit = limit
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline

    @property
    def buffered(self) -> int:
        """Bytes held now (at most ``limit + 1``)."""
        return len(self._buf)

    def room(self) -> int:
        """How many bytes the next read may take without the buffer
        outgrowing a line of ``limit`` bytes and its newline."""
        return max(0, self.limit + 1 - len(self._buf))

    def feed(self, data: bytes) -> None:
        """Add what the socket gave. Raises ValueError (the caller's bug:
        it read more than ``room()``) rather than grow past the limit."""
        if len(data) > self.room():
            raise ValueError(f"{len(data)} bytes fed where {self.room()} fit (line limit {self.limit})")
        self._buf += data

    def next_line(self) -> bytes | None:
        """The next whole line without its newline (``\\r`` is left to the
        JSON parser, which ignores it), or None when none is complete yet.
        Raises LineTooLong when more than ``limit`` bytes are held without
        a newline; the connection should then be answered and closed."""
        nl = self._buf.find(b"\n", self._scanned)
        if nl < 0:
            self._scanned = len(self._buf)
            if len(self._buf) > self.limit:
                raise LineTooLong(len(self._buf), self.limit)
            return None
        if nl > self.limit:  # (cannot happen while feed keeps to room(); kept for a lowered limit)
            raise LineTooLong(nl, self.limit)
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]  # (bytearray drops a prefix without moving the rest)
        self._scanned = 0
        return line
