"""The declared bounds of every surface that takes input from outside.

Every listener and socket (the platform's, the direct-link listener, the
user socket, the admin socket, the web console) and every decoder that
inflates data it did not make (frames, chunks, manifests, configuration,
backups) takes its limits from this one table: the bytes a peer may send
before it has proved who it is, the time it has to do so, the connections
one identity and everyone together may hold, the bytes buffered per peer,
the output a decoder may produce per input. A surface added later declares
its bounds here first; docs/security.md ("Bounds") holds this table as
``bounds_table()`` prints it, and a test compares the two.

A bound with a ``setting`` is the default of that ``semq.toml`` key (the
config rule checks it; the daemon uses the configured value). The rest are
fixed: a peer must not be able to make them larger, and an operator has had
no reason to.

This module is pure: values and words, no I/O (the layering test keeps it
below everything that imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from semq.umxt_protocol import DEFAULT_MAX_FRAME, HELLO_MAX_FRAME, MAX_CRL

__all__ = [
    "ADMIN_IDLE_S",
    "ADMIN_MAX_CLIENTS",
    "ADMIN_MAX_REQUEST",
    "BACKUP_MAX_MEMBER_RATIO",
    "BACKUP_MAX_META",
    "BOUNDS",
    "CHUNK_MAX_OUTPUT",
    "CONFIG_MAX_BYTES",
    "CONSOLE_FORM_S",
    "CONSOLE_HANDSHAKE_S",
    "CONSOLE_IDLE_S",
    "CONSOLE_LOGINS_IN_FLIGHT",
    "CONSOLE_LOGIN_WAIT_S",
    "CONSOLE_MAX_FAILURES",
    "CONSOLE_MAX_FAILURES_ADDRESS",
    "CONSOLE_MAX_FORM",
    "CONSOLE_MAX_HEADER",
    "DEFERRED_CHUNK_BYTES",
    "DIRECT_HANDSHAKES",
    "DIRECT_HELLO_S",
    "DIRECT_MAX_LINKS",
    "DIRECT_MAX_LINKS_PER_ORG",
    "DIRECT_PRE_AUTH_BYTES",
    "EDGE_MAX_BODY",
    "EDGE_MAX_CONNECTIONS",
    "EDGE_MAX_INFLATED",
    "EDGE_REQUEST_S",
    "FD_RESERVE",
    "LINK_BUFFER_BYTES",
    "PLATFORM_BUFFER_MIB_PER_ORG",
    "PLATFORM_HANDSHAKES",
    "PLATFORM_HELLO_S",
    "PLATFORM_MAX_CONNECTIONS",
    "PLATFORM_PRE_AUTH_BYTES",
    "USER_AUTH_BYTES",
    "USER_AUTH_PER_ACCOUNT",
    "USER_AUTH_S",
    "USER_BLOCK_BYTES",
    "USER_IDLE_S",
    "USER_MAX_CONNECTIONS",
    "USER_MAX_CONNECTIONS_PER_USER",
    "USER_MAX_REQUEST",
    "USER_UPLOADS_PER_USER",
    "USER_UPLOAD_IDLE_S",
    "USER_UPLOAD_KEEP_FREE",
    "Bound",
    "bounds_table",
]


@dataclass(frozen=True)
class Bound:
    """One declared bound: on ``surface``, ``what`` is at most ``value``
    ``unit``; ``setting`` is the ``semq.toml`` key that changes it (its
    default is ``value``), ``why`` one line on what it protects."""

    surface: str
    what: str
    value: int | float
    unit: str
    why: str
    setting: str | None = None

    def shown(self) -> str:
        v = self.value
        if self.unit == "bytes" and isinstance(v, int) and v >= 1024 and v % 1024 == 0:
            return f"{v >> 20} MiB" if v % (1 << 20) == 0 else f"{v >> 10} KiB"
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return f"{v} {self.unit}" if self.unit else str(v)


_TABLE: list[Bound] = []


def _declare(surface: str, what: str, value: int | float, unit: str, why: str, setting: str | None = None,
             ) -> int | float:
    _TABLE.append(Bound(surface, what, value, unit, why, setting))
    return value


def _int(surface: str, what: str, value: int, unit: str, why: str, setting: str | None = None) -> int:
    _declare(surface, what, value, unit, why, setting)
    return value


def _float(surface: str, what: str, value: float, unit: str, why: str, setting: str | None = None) -> float:
    _declare(surface, what, value, unit, why, setting)
    return value


_P = "platform listener"
_D = "direct-link listener"
_U = "user socket"
_A = "admin socket"
_W = "web console"
_N = "node process"
_F = "decoders"
_E = "edge listener (AS2, AS4)"

# ---------------------------------------------------------------- the edge's listener (AS2, AS4)

EDGE_MAX_BODY: Final = _int(
    _E, "bytes of a request's body", 32 << 20, "bytes",
    "read up to it and no further: a larger body is refused (413) before anything parses it")
EDGE_MAX_INFLATED: Final = _int(
    _E, "bytes a compressed message may inflate to", 64 << 20, "bytes",
    "a compression bomb is refused after inflating at most this much, never inflated whole")
EDGE_MAX_CONNECTIONS: Final = _int(
    _E, "connections in total", 64, "connections",
    "a partner's gateway sends a few at a time; beyond it new connections wait in the backlog")
EDGE_REQUEST_S: Final = _float(
    _E, "time to send a request's headers and body", 60.0, "s",
    "a connection that trickles its request is closed")

# ---------------------------------------------------------------- the platform's listener

PLATFORM_PRE_AUTH_BYTES: Final = _int(
    _P, "bytes of a frame before HELLO is accepted", HELLO_MAX_FRAME, "bytes",
    "a stranger or an organization not yet admitted cannot make the relay buffer a document-sized frame")
PLATFORM_HELLO_S: Final = _float(
    _P, "time for the TLS handshake, then again for HELLO", 10.0, "s",
    "a connection that never authenticates is closed")
PLATFORM_HANDSHAKES: Final = _int(
    _P, "connections still in their TLS handshake or before HELLO", 256, "connections",
    "strangers that connect and say nothing cannot hold the relay's descriptors", setting="max_handshakes")
PLATFORM_MAX_CONNECTIONS: Final = _int(
    _P, "connections in total", 10_000, "connections",
    "beyond it new connections are closed at once; never more than the descriptors left after the reserve",
    setting="max_connections")
_int(_P, "connections of one organization", 4, "connections",
     "plus one per unit beyond the first, the units counted from the platform's own record of the organization"
     " (never from its HELLO)", setting="max_connections_per_org")
_int(_P, "units of one organization", 8, "units",
     "what an organization's HELLO may say; its connection allowance follows the platform's record",
     setting="max_units_per_org")
PLATFORM_BUFFER_MIB_PER_ORG: Final = _int(
    _P, "bytes buffered for one organization, all its connections together", 96, "MiB",
    "a frame's bytes are reserved from its organization's budget when its header arrives: sixteen sessions"
    " with 60 MiB frames wait for each other instead of filling the relay", setting="max_buffer_mib_per_org")
_int(_P, "bytes of one frame after HELLO", DEFAULT_MAX_FRAME, "bytes",
     "the largest one-frame document; larger documents travel in chunks of at most 16 MiB")

# ---------------------------------------------------------------- the direct-link listener

DIRECT_PRE_AUTH_BYTES: Final = _int(
    _D, "bytes of a frame before HELLO is accepted", HELLO_MAX_FRAME, "bytes",
    "a dialler the node does not accept never gets a document-sized frame buffered")
DIRECT_HELLO_S: Final = _float(
    _D, "time from connect to an accepted HELLO (TLS handshake included)", 10.0, "s",
    "a link that never authenticates is closed")
DIRECT_HANDSHAKES: Final = _int(
    _D, "links still in their TLS handshake or before HELLO", 32, "links",
    "strangers cannot hold the node's descriptors by connecting and saying nothing",
    setting="direct_handshakes")
DIRECT_MAX_LINKS: Final = _int(
    _D, "links in total", 256, "links",
    "beyond it a new link is refused (TOO_MANY_CONNECTIONS); never more than the descriptors left after"
    " the reserve", setting="direct_max_links")
DIRECT_MAX_LINKS_PER_ORG: Final = _int(
    _D, "links of one organization", 4, "links",
    "one partner cannot take the listener's room from the others", setting="direct_max_links_per_org")
_declare(_D, "organizations allowed", 0, "",
         "direct_from is checked right after the TLS handshake, before any frame is read", setting="direct_from")
LINK_BUFFER_BYTES: Final = _int(
    _D, "bytes buffered per link after HELLO (frames read ahead of the store)", 16 << 20, "bytes",
    "plus one frame being read: a partner sending faster than the store writes is pushed back by TCP")

# ---------------------------------------------------------------- the node process as a whole

FD_RESERVE: Final = _int(
    _N, "file descriptors kept for the node's own use", 64, "descriptors",
    "the platform session, the store, its logs and the admin socket never starve: listeners stop accepting"
    " before the process's descriptor limit comes this close", setting="fd_reserve")
DEFERRED_CHUNK_BYTES: Final = _int(
    _N, "bytes of chunks held per origin while its certificate is asked for", 16 << 20, "bytes",
    "past it they are dropped and sent again once the origin is known")

# ---------------------------------------------------------------- the user socket

USER_AUTH_BYTES: Final = _int(
    _U, "bytes of the first line, which must authenticate", 4096, "bytes",
    "a local account without a token cannot make the node buffer anything larger")
USER_AUTH_S: Final = _float(
    _U, "time from connect to the authenticating first line", 5.0, "s",
    "a connection that says nothing is closed")
USER_MAX_REQUEST: Final = _int(
    _U, "bytes of one request line after authentication", 2 << 20, "bytes",
    "a document over one block travels in blocks (its base64 and fields fit)")
USER_BLOCK_BYTES: Final = _int(
    _U, "bytes of a document per block, either way", 1 << 20, "bytes",
    "documents larger than one block are sent and read in blocks, never whole in one request")
USER_MAX_CONNECTIONS: Final = _int(
    _U, "connections in total", 64, "connections",
    "more get an error line and are closed", setting="user_socket_max_connections")
USER_MAX_CONNECTIONS_PER_USER: Final = _int(
    _U, "connections of one user", 8, "connections",
    "one user's application cannot take the socket from the others")
USER_AUTH_PER_ACCOUNT: Final = _int(
    _U, "connections of one operating-system account before their first line", 8, "connections",
    "the kernel says which account connected (SO_PEERCRED): one that connects and says nothing holds at most"
    " these, never the whole socket")
USER_IDLE_S: Final = _float(
    _U, "time without a request after authentication, and for an answer to be taken", 60.0, "s",
    "an idle connection, or one that does not read its answers, gives its room back")
USER_UPLOADS_PER_USER: Final = _int(
    _U, "documents one user is uploading in blocks at once", 4, "uploads",
    "each reserves up to max_document_mib on the node's disk until it is sent or removed")
USER_UPLOAD_IDLE_S: Final = _float(
    _U, "time an upload waits for its next block", 600.0, "s",
    "a stale upload is removed with its staged file")
USER_UPLOAD_KEEP_FREE: Final = _int(
    _U, "bytes an upload leaves free on the data directory's file system", 256 << 20, "bytes",
    "counting what open uploads still need: users' uploads cannot fill the disk the store commits to")

# ---------------------------------------------------------------- the admin socket

ADMIN_MAX_REQUEST: Final = _int(
    _A, "bytes of one request line", 64 * 1024, "bytes",
    "owner-only (0600) socket; a longer line is refused and the connection closed")
ADMIN_MAX_CLIENTS: Final = _int(_A, "connections in total", 32, "connections", "more get an error line")
ADMIN_IDLE_S: Final = _float(_A, "time without a request", 60.0, "s", "an idle connection is closed")

# ---------------------------------------------------------------- the web console

CONSOLE_MAX_FORM: Final = _int(_W, "bytes of a POSTed form", 64 * 1024, "bytes", "larger ones get 400")
CONSOLE_FORM_S: Final = _float(
    _W, "time to send a POSTed form's body", 30.0, "s",
    "a client that trickles a form is answered 400 and cannot hold the request open")
CONSOLE_MAX_HEADER: Final = _int(
    _W, "bytes of a request's head", 16 * 1024, "bytes",
    "HTTP/1.1 requests with larger heads are refused (the console speaks HTTP/1.1 only: no HTTP/2 streams)")
CONSOLE_HANDSHAKE_S: Final = _float(
    _W, "time for the TLS handshake", 10.0, "s", "a client that connects and says nothing is closed")
CONSOLE_IDLE_S: Final = _float(
    _W, "time a connection waits for a request's complete head", 30.0, "s",
    "an idle keep-alive connection, or one sending its head slowly, is closed")
CONSOLE_MAX_FAILURES: Final = _int(
    _W, "failed logins of one account name in 5 minutes", 5, "attempts",
    "then the name is locked for 5 minutes; an attempt is counted before its password is checked")
CONSOLE_MAX_FAILURES_ADDRESS: Final = _int(
    _W, "failed logins from one address in 5 minutes", 20, "attempts", "then the address is locked for 5 minutes")
CONSOLE_LOGINS_IN_FLIGHT: Final = _int(
    _W, "logins being checked at once per account name and per address", 1, "logins",
    "parallel guesses wait for each other, so the throttle sees every one")
CONSOLE_LOGIN_WAIT_S: Final = _float(
    _W, "time a login waits for another of the same name or address to be checked", 5.0, "s",
    "then it is answered 429 unchecked: a queue of guesses cannot hold requests open")

# ---------------------------------------------------------------- decoders of outside data

_int(_F, "frame: bytes declared in its header", DEFAULT_MAX_FRAME, "bytes",
     "checked on the fixed header, before the body is waited for (RemoteProtocolError, FRAME_TOO_LARGE)")
CHUNK_MAX_OUTPUT: Final = _int(
    _F, "chunk: bytes of content a compressed chunk may inflate to", 16 << 20, "bytes",
    "never more than the chunk's size in its manifest (at most 16 MiB): a zstd frame that declares more is"
    " refused unread, one that declares nothing is inflated to size + 1 at most; a chunk that fails is a bad"
    " chunk, never the daemon's end")
_int(_F, "manifest: bytes of a large document", 4096 << 20, "bytes",
     "refused with TOO_LARGE before a byte of content is written", setting="max_document_mib")
_int(_F, "certificate revocation list in a CRL frame", MAX_CRL, "bytes", "about 100,000 revoked certificates")
CONFIG_MAX_BYTES: Final = _int(_F, "semq.toml", 1 << 20, "bytes", "a larger file is refused unread")
BACKUP_MAX_MEMBER_RATIO: Final = _int(
    _F, "backup restore: bytes written per archive byte", 1024, "x",
    "a gzip bomb in a backup is refused before the disk fills: the members' declared sizes are summed first"
    " (and must fit the free space too), and the inflated stream may not exceed it either")
BACKUP_MAX_META: Final = _int(
    _F, "backup restore: bytes of a pax or long-name header", 64 * 1024, "bytes",
    "such a header is read into memory whole; a semq backup's are a few hundred bytes")

BOUNDS: Final[tuple[Bound, ...]] = tuple(_TABLE)


def bounds_table() -> str:
    """The table as Markdown (docs/security.md, "Bounds", holds this output)."""
    rows = ["| surface | bound | at most | `semq.toml` | why |", "|---|---|---|---|---|"]
    for b in BOUNDS:
        setting = f"`{b.setting}`" if b.setting else "fixed"
        rows.append(f"| {b.surface} | {b.what} | {b.shown() if b.value else '—'} | {setting} | {b.why} |")
    return "\n".join(rows) + "\n"
