"""A platform and nodes as real processes on 127.0.0.1 with the web
console on (``--web 127.0.0.1:0``), documents exchanged, and console
accounts: what tests/web/test_console.py and test_console_browser.py use.
Every wait is bounded; every process is killed at teardown."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.tracking.history import HistoryReader, history_paths
from tests._procs import Cluster, Proc, read_status, wait_until

__all__ = ["HOSTILE_KEY", "PASSWORDS", "ConsoleCluster", "client", "csrf_of", "login"]

A, B, C = "10001", "20002", "30003"  # C is enrolled but never runs: documents to it wait at the platform
HOSTILE_KEY = "<script>alert('pwned')</script>"
PASSWORDS = {"alice": "alice-operator-pw", "victor": "victor-viewer-pw", "bob": "bob-operator-pw"}
ROLES = {"alice": "operator", "victor": "viewer", "bob": "operator"}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class ConsoleCluster:
    root: Path
    cluster: Cluster = field(init=False)
    node_url: str = ""
    platform_url: str = ""
    sent: dict[str, str] = field(default_factory=dict)  # what -> LK0

    def __post_init__(self) -> None:
        self.cluster = Cluster(self.root, inquiry_interval=0.5)

    @property
    def a_dir(self) -> Path:
        return self.root / A

    def start(self) -> None:
        c = self.cluster
        for org in (A, B, C):
            c.add_org(org)
        for name, pw in PASSWORDS.items():
            f = self.root / f"{name}.pw"
            f.write_text(pw + "\n")
            for d in (self.a_dir, self.root / "P"):
                assert semq_main(["console", "user", "add", name, "--role", ROLES[name], "--password-file", str(f),
                                  "--dir", str(d)]) == 0
        c.procs["P"] = Proc("platform", ["platform", "run", "--dir", str(self.root / "P"), "--listen",
                                         f"127.0.0.1:{c.port}", "--inquiry-interval", c.iq, "--web", "127.0.0.1:0"],
                            self.root / "platform.log", "listening on")
        c.start_node(A, "--web", "127.0.0.1:0")
        c.start_node(B)
        self.node_url = f"https://{wait_until(lambda: read_status(self.a_dir).get('web'), 20, 'the node console')}"
        self.platform_url = ("https://" +
                             wait_until(lambda: read_status(self.root / "P").get("web"), 20, "the platform console"))
        with NodeClient(self.a_dir) as node:
            self.sent["hostile"] = str(node.send(to=B, data=b"<b>hi</b>", data_type="ORDER", domain="trade",
                                                 key=HOSTILE_KEY))
            for i in range(3):
                self.sent[f"inv{i}"] = str(node.send(to=B, data=b"x" * (100 + i), data_type="INVOICE",
                                                     domain="trade", key=f"INV-{i:04d}"))
            self.sent["waiting"] = str(node.send(to=C, data=b"for C", data_type="ORDER", domain="trade",
                                                 key="WAIT-0001"))
        wait_until(lambda: self.state("hostile") == "ack2" and self.state("inv2") == "ack2", 60,
                   "the documents to B confirmed end to end")
        wait_until(lambda: self.state("waiting") == "ack_save", 60, "the document to C stored at the platform")

    def state(self, what: str) -> str | None:
        r = HistoryReader(history_paths(self.a_dir))
        try:
            rows = [x for x in r.document(self.sent[what]) if x["role"] == "origin"]
        finally:
            r.close()
        return rows[0]["state"] if rows else None

    def node_ssl(self) -> ssl.SSLContext:
        """Trusts the node console's own certificate (made in console/)."""
        return ssl.create_default_context(cafile=str(self.a_dir / "console" / "console.pem"))

    def platform_ssl(self) -> ssl.SSLContext:
        """Trusts the platform's CA (the console serves tls/server.pem)."""
        return ssl.create_default_context(cafile=str(self.root / "P" / "ca" / "ca.pem"))

    def stop(self) -> None:
        self.cluster.stop_all()


def client(url: str, ctx: ssl.SSLContext) -> httpx.Client:
    return httpx.Client(base_url=url, verify=ctx, follow_redirects=False, timeout=30.0)


def csrf_of(html: str) -> str:
    m = _CSRF.search(html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def login(c: httpx.Client, user: str, password: str | None = None) -> httpx.Response:
    """Log in through the form (its CSRF cookie too); the session cookie stays in ``c``."""
    page = c.get("/login")
    assert page.status_code == 200
    return c.post("/login", data={"csrf": csrf_of(page.text), "user": user,
                                  "password": PASSWORDS.get(user, "") if password is None else password,
                                  "next": "/"})


