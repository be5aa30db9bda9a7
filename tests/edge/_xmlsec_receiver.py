"""An AS4 receiver process that shares no code with SEMQ's adapter or the
``as4`` package (``_xmlsec_verify``: libxmlsec1, libxml2, the standard
library). It answers 200 with what it read (JSON) or 400 with why not.
Prints ``ready PORT``.

    python -m tests.edge._xmlsec_receiver SENDER_CERT RECEIVER_KEY [VERDICTS]

VERDICTS, if given, gets one JSON line per POST (what it read, or why not).
"""

from __future__ import annotations

import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from tests.edge._xmlsec_verify import Rejected, verify


def main(sender_cert: str, receiver_key: str, verdicts: str = "") -> int:
    cert, key = Path(sender_cert).read_bytes(), Path(receiver_key).read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 64 * 1024 * 1024))
            try:
                seen = verify(dict(self.headers.items()), body, cert, key)
                sbd = seen.pop("sbd")
                seen["sbd_sha256"] = hashlib.sha256(sbd).hexdigest()
                seen["sbd_has_invoice"] = b"<cbc:ID>INV-0042</cbc:ID>" in sbd and b"StandardBusinessDocumentHeader" in sbd
                status, answer = 200, json.dumps(seen).encode()
            except (Rejected, KeyError, AttributeError, ValueError) as e:
                status, answer = 400, f"{type(e).__name__}: {e}".encode()
            if verdicts:
                with open(verdicts, "a") as f:
                    f.write(json.dumps({"status": status, "answer": answer.decode()}) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            print(format % args, flush=True)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
