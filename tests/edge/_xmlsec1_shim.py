"""``xmlsec1 --encrypt`` as peppol-py runs it, on python-xmlsec (the
libxmlsec1 1.3 library inside its wheel): Debian ships the xmlsec1 command
at 1.2, which lacks the AES-GCM and RSA-OAEP (MGF1-SHA-256) peppol-py needs.
Only the arguments peppol-py passes are understood:

    xmlsec1 --encrypt --pubkey-cert-pem CERT --session-key aes-128
            --binary-data /dev/stdin [--lax-key-search] TEMPLATE
"""

from __future__ import annotations

import sys

import xmlsec
from lxml import etree


def main(argv: list[str]) -> int:
    if "--encrypt" not in argv or argv[argv.index("--session-key") + 1] != "aes-128":
        print(f"xmlsec1 shim: unsupported arguments {argv}", file=sys.stderr)
        return 2
    cert = argv[argv.index("--pubkey-cert-pem") + 1]
    template = argv[-1]
    data = sys.stdin.buffer.read()
    manager = xmlsec.KeysManager()
    manager.add_key(xmlsec.Key.from_file(cert, xmlsec.constants.KeyDataFormatCertPem, None))
    ctx = xmlsec.EncryptionContext(manager)
    ctx.key = xmlsec.Key.generate(xmlsec.constants.KeyDataAes, 128, xmlsec.constants.KeyDataTypeSession)
    root = etree.parse(template).getroot()
    # --lax-key-search: find the key without the template's (empty) KeyName.
    for name in root.iter("{http://www.w3.org/2000/09/xmldsig#}KeyName"):
        name.getparent().remove(name)
    encrypted = ctx.encrypt_binary(root, data)
    sys.stdout.buffer.write(etree.tostring(encrypted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
