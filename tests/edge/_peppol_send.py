"""peppol-py sends one UBL invoice to an AS4 endpoint, as its
``send_peppol_document`` does minus the two steps that need the Peppol
network: the SMP look-up (DNS) that finds the endpoint and its certificate,
and the check of that certificate against the Peppol CA. Prints
``accepted`` when peppol-py accepts the answer, else peppol-py's error.

    python -m tests.edge._peppol_send URL INVOICE SENDER_KEY SENDER_CERT RECEIVER_CERT XMLSEC1
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from lxml import etree
from peppol_py.as4_sender import (
    get_headers_and_body_for_posting_as4_document,
    post_edelivery_as4_document,
)
from peppol_py.exception import SendPeppolError
from peppol_py.sender import (
    get_common_name_from_certificate,
    get_document_type_from_ubl,
    wrap_ubl_in_peppol_standard_business_document_header,
)


def main(url: str, invoice: str, keyfile: str, certfile: str, receiver_certfile: str, xmlsec1: str) -> int:
    document_xml = etree.fromstring(Path(invoice).read_bytes())
    supplier = document_xml.find("./{*}AccountingSupplierParty/{*}Party/{*}EndpointID")
    customer = document_xml.find("./{*}AccountingCustomerParty/{*}Party/{*}EndpointID")
    sender_id = supplier.get("schemeID") + ":" + supplier.text
    receiver_id = customer.get("schemeID") + ":" + customer.text
    country = document_xml.findtext("./{*}AccountingSupplierParty/{*}Party/{*}PostalAddress/{*}Country/"
                                    "{*}IdentificationCode")
    document_type = get_document_type_from_ubl(document_xml, document_type_version="2.1")
    process_type = document_xml.findtext("./{*}ProfileID")
    now = datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0).isoformat()
    content, sbd = wrap_ubl_in_peppol_standard_business_document_header(
        document_xml, now, document_type, process_type, sender_id, country, receiver_id)
    sender_cert = Path(certfile).read_bytes()
    receiver_cert = Path(receiver_certfile).read_bytes()
    body, headers = get_headers_and_body_for_posting_as4_document(
        content, sbd, now, document_type, process_type, sender_id, receiver_id,
        get_common_name_from_certificate(receiver_cert), xmlsec1, keyfile, None, sender_cert, receiver_cert,
        get_common_name_from_certificate(sender_cert))
    try:
        post_edelivery_as4_document(url, body, headers, timeout=20, user_agent="peppol-py")
    except SendPeppolError as e:
        print(f"refused: {e}", flush=True)
        return 1
    print("accepted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
