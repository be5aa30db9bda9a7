"""Protocol errors, split by who is at fault (as in h11), each carrying the
result code to send back to the peer."""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "ResultCode",
]


class ResultCode(IntEnum):
    """Numbered result codes (seed 004 "numbered result codes"). Carried by
    ERROR, NACK, CHUNK_ACK, BYE, CERT_RESPONSE and PEER_INFO frames and by
    every ProtocolError.
    Ranges: 0 ok, 1xx frame, 2xx session/auth, 3xx routing, 4xx storage,
    5xx security, 6xx application, 9xx server."""

    OK = 0  # success
    # 1xx: the bytes of a frame (STYLE: "a parse failure carries the close code")
    MALFORMED_FRAME = 100  # the frame does not follow the UMX-T layout
    BAD_CHECKSUM = 101  # CRC32 trailer does not match the frame
    FRAME_TOO_LARGE = 102  # declared length exceeds the receiver's limit
    UNSUPPORTED_VERSION = 103  # version byte not understood by the receiver
    UNKNOWN_KIND = 104  # kind byte not defined in this version
    INVALID_FIELD = 105  # a field value is out of its range (SaveFwd 4, empty node id, ...)
    UNEXPECTED_FRAME = 106  # a valid frame that is not allowed in the current state
    # 2xx: session and authentication
    NOT_AUTHENTICATED = 200  # a frame other than HELLO before the session is established
    AUTH_FAILED = 201  # credentials or certificate refused
    SOURCE_MISMATCH = 202  # frame claims a source other than the authenticated endpoint
    DUPLICATE_SESSION = 203  # the endpoint connected again; the older session is closed
    CERT_REVOKED = 204  # the peer's certificate is on the revocation list
    HANDSHAKE_TIMEOUT = 205  # HELLO did not arrive in time
    IDLE_TIMEOUT = 206  # no traffic (not even PING) within the idle limit
    TOO_MANY_CONNECTIONS = 207  # the organization already holds as many connections as it may
    # 3xx: routing (SPEC "The flow", platform step 1)
    UNKNOWN_TARGET = 300  # the target endpoint is not known to the platform
    TARGET_OFFLINE_DROPPED = 301  # SaveFwd=1 and the target is offline: discarded
    OVER_WINDOW = 302  # sender exceeded the flow-control window (seed 004)
    EXPIRED = 303  # the document's expiry passed before delivery
    TOO_MANY_ATTEMPTS = 304  # resend limit reached; moved to the dead letters
    STALE = 305  # created outside the receiver's duplicate-suppression window (a possible replay): refused
    DIRECT_NOT_ALLOWED = 306  # the target does not accept direct links from this organization
    NO_DIRECT_ADDRESS = 307  # the target announced no address for direct links (or it expired)
    GAP_ANNOUNCED = 308  # an ordered document that came after its origin announced it failed: its place is gone
    TOO_LARGE = 309  # a document over the receiver's size limit for documents
    # 4xx: storage
    STORE_FULL = 400  # disk full: refused, nothing accepted
    STORE_ERROR = 401  # the store failed (read-only, corrupt, locked)
    QUOTA_EXCEEDED = 402  # the origin's storage quota at the platform is used up: it keeps the document, retries later
    # 5xx: security
    BAD_SIGNATURE = 500  # document signature did not verify
    DECRYPT_FAILED = 501  # payload could not be decrypted / authenticated
    UNKNOWN_CERTIFICATE = 502  # no certificate is known for the endpoint
    CERT_NOT_TRUSTED = 503  # a certificate the node has not pinned for that organization (nor accepted)
    BAD_RECEIPT = 504  # an ACK2 whose signed receipt is missing or does not verify: the document stays open
    BAD_CHUNK = 505  # a chunk of a large document failed to open or verify: tampered, moved to another index or from another document
    DIGEST_MISMATCH = 506  # a large document's content does not match the digest its signed manifest names
    # 6xx: application
    REJECTED_BY_APPLICATION = 600  # the receiving application refused the document
    # 9xx: server
    SHUTTING_DOWN = 900  # the peer is draining and closes the connection
    INTERNAL_ERROR = 999  # a bug: the peer logged it


class ProtocolError(Exception):
    """Base of every UMX-T error. ``code`` is what to send back to the peer."""

    code: ResultCode

    def __init__(self, message: str, code: ResultCode = ResultCode.MALFORMED_FRAME) -> None:
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """We tried to build or send something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""
