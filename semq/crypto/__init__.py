"""SEMQ security: the platform's certificate authority, node identities and
certificates, mutual TLS 1.3, end-to-end encryption of AppData, document
signatures and signed delivery receipts (SPEC "Security"; docs/security.md).

Pure and synchronous: no trio, no sockets (STYLE 1). Public-key operations
cost 0.1-0.3 ms each; daemons run them in a worker thread, a batch at a time.

Origin::

    aad = frame_aad(frame)                 # or document_aad(lk0, origin, target, app_key, save_fwd)
    doc = protect_document(body, aad=aad, signing_key=me.keys.signing_key,
                           recipients=directory.lookup(target), sealer=sealer)
    Data(..., encrypt=doc.encrypt, session_key=doc.session_key, app_data=doc.app_data)
    # keep doc.digest; on ACK2: verify_receipt(ack.receipt, digest=..., lk0=..., receiver_certs=...)

Receiver::

    got = open_document(data.app_data, data.session_key, aad=frame_aad(frame), keys=opener,
                        signer_certs=directory.lookup(frame.origin))
    Ack(..., receipt=make_receipt(got.digest, data.lk0, me.keys.signing_key))
"""

from ._aad import (
    AAD_PREFIX,
    DocumentHeader,
    document_aad,
    document_aad_fields,
    frame_aad,
    parse_document_aad,
    raw_frame_aad,
)
from ._directory import MAX_CERTS_PER_ORG, CertificateDirectory
from ._document import ProtectedDocument, open_document, protect_document, protect_documents
from ._envelope import (
    BLOB_HEADER_SIZE,
    BLOB_MAGIC,
    MAX_RECIPIENT_KEYS,
    WRAP_SIZE,
    Opener,
    Sealer,
    blob_key_ids,
    open_,
    seal,
)
from ._errors import (
    BadSignature,
    CertificateError,
    CertificateExpired,
    CertificateRevoked,
    CryptoError,
    DecryptError,
    KeyFileError,
    UnknownCertificate,
)
from ._files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    check_private_key_permissions,
    ensure_private_directory,
    load_certificate,
    load_certificates,
    load_crl,
    load_csr,
    load_private_key,
    save_certificate,
    save_certificates,
    save_crl,
    save_csr,
    save_private_key,
)
from ._pki import (
    CLOCK_SKEW,
    DEFAULT_CA_DAYS,
    DEFAULT_CRL_DAYS,
    DEFAULT_NODE_DAYS,
    DEFAULT_SERVER_DAYS,
    KEY_ID_SIZE,
    ORG_URI_PREFIX,
    SEMQ_X25519_OID,
    CertificateAuthority,
    NodeCertificate,
    NodeIdentity,
    NodeKeys,
    certificate_org,
    expiring_within,
    fingerprint,
    format_time,
    key_id,
    make_csr,
    verify_crl,
    verify_node_certificate,
)
from ._receipts import (
    MAX_RECEIPT,
    MAX_RECEIPT_BATCH,
    ReceiptForm,
    ReceiptInfo,
    ack_entry_lk0,
    make_batch_receipt,
    make_receipt,
    receipt_proofs,
    verify_batch_receipt,
    verify_receipt,
)
from ._signing import (
    MAX_SIGN_BATCH,
    SignatureCache,
    SignedDocument,
    VerifiedDocument,
    document_digest,
    sign_document,
    sign_documents,
    verify_document,
)
from ._tls import client_ssl_context, peer_certificate, peer_organization, server_ssl_context

__all__ = [
    "AAD_PREFIX",
    "BLOB_HEADER_SIZE",
    "BLOB_MAGIC",
    "CLOCK_SKEW",
    "DEFAULT_CA_DAYS",
    "DEFAULT_CRL_DAYS",
    "DEFAULT_NODE_DAYS",
    "DEFAULT_SERVER_DAYS",
    "KEY_ID_SIZE",
    "MAX_CERTS_PER_ORG",
    "MAX_RECEIPT",
    "MAX_RECEIPT_BATCH",
    "MAX_RECIPIENT_KEYS",
    "MAX_SIGN_BATCH",
    "ORG_URI_PREFIX",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SEMQ_X25519_OID",
    "WRAP_SIZE",
    "BadSignature",
    "CertificateAuthority",
    "CertificateDirectory",
    "CertificateError",
    "CertificateExpired",
    "CertificateRevoked",
    "CryptoError",
    "DecryptError",
    "DocumentHeader",
    "KeyFileError",
    "NodeCertificate",
    "NodeIdentity",
    "NodeKeys",
    "Opener",
    "ProtectedDocument",
    "ReceiptForm",
    "ReceiptInfo",
    "Sealer",
    "SignatureCache",
    "SignedDocument",
    "UnknownCertificate",
    "VerifiedDocument",
    "ack_entry_lk0",
    "blob_key_ids",
    "certificate_org",
    "check_private_key_permissions",
    "client_ssl_context",
    "document_aad",
    "document_aad_fields",
    "document_digest",
    "ensure_private_directory",
    "expiring_within",
    "fingerprint",
    "format_time",
    "frame_aad",
    "key_id",
    "load_certificate",
    "load_certificates",
    "load_crl",
    "load_csr",
    "load_private_key",
    "make_batch_receipt",
    "make_csr",
    "make_receipt",
    "open_",
    "open_document",
    "parse_document_aad",
    "peer_certificate",
    "peer_organization",
    "protect_document",
    "protect_documents",
    "raw_frame_aad",
    "receipt_proofs",
    "save_certificate",
    "save_certificates",
    "save_crl",
    "save_csr",
    "save_private_key",
    "seal",
    "server_ssl_context",
    "sign_document",
    "sign_documents",
    "verify_batch_receipt",
    "verify_crl",
    "verify_document",
    "verify_node_certificate",
    "verify_receipt",
]
