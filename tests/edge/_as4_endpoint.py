"""A minimal AS4 endpoint process for the interop tests, on SEMQ's adapter:
POST -> read_inbound -> the document written to the inbox folder (fsync'd,
then renamed) -> receipt_for, or the adapter's ebMS error. One partner
table from a JSON file. Prints ``ready PORT`` once it listens on
127.0.0.1 (port 0: the system's choice).

    python -m tests.edge._as4_endpoint CONFIG.json
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from semq.edge.as4 import AS4
from semq.edge.as4.options import MAX_MESSAGE
from semq.edge.protocol import EdgePartner, EdgeRefusal, OurKeys


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    ours = OurKeys(cert_pem=Path(config["cert"]).read_bytes(), key_pem=Path(config["key"]).read_bytes())
    partners = {p["id"]: EdgePartner(id=p["id"], protocol="as4", url="", our_id=p["our_id"],
                                     their_cert_pem=Path(p["cert"]).read_bytes(), options=p.get("options", {}))
                 for p in config["partners"]}
    inbox = Path(config["inbox"])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or -1)
            if not 0 <= length <= MAX_MESSAGE:
                self._answer(413, {"Content-Type": "text/plain"}, b"length required, at most 64 MiB\n")
                return
            body = self.rfile.read(length)
            headers = dict(self.headers.items())
            if not AS4.claims(headers):
                self._answer(415, {"Content-Type": "text/plain"}, b"not AS4\n")
                return
            try:
                got = AS4.read_inbound(headers, body, partners.get, ours)
            except EdgeRefusal as refusal:
                (inbox / "refusals.log").open("a").write(refusal.reason + "\n")
                self._answer(refusal.status, dict(refusal.headers), refusal.body)
                return
            name = got.message_id.replace("/", "_")
            tmp = inbox / f".{name}.tmp"
            with tmp.open("wb") as f:
                f.write(got.content)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(inbox / f"{name}.xml")
            status, out_headers, receipt = AS4.receipt_for(got, headers, partners[got.partner_id], ours)
            (inbox / f"{name}.receipt").write_bytes(receipt)
            self._answer(status, out_headers, receipt)

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            print(format % args, flush=True)

    server = HTTPServer(("127.0.0.1", int(config.get("port", 0))), Handler)
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
