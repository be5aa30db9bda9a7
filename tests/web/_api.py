"""A platform and two nodes as real processes on 127.0.0.1, both serving
the web console and its HTTP API (``--web 127.0.0.1:0``), with users on
each (``semq user add``: their tokens) and a console account on node A:
what tests/web/test_api.py and test_api_browser.py use. Every wait is
bounded; every process is killed at teardown."""

from __future__ import annotations

import contextlib
import io
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from semq.cli import main as semq_main
from tests._procs import Cluster, read_status, set_config, wait_until

__all__ = ["PASSWORD", "A", "ApiCluster", "B"]

A, B = "10001", "20002"
PASSWORD = "olga-operator-pw"  # console account "olga" (operator) on A; "vera" is a viewer


def _token(directory: Path, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert semq_main(["user", "add", name, "--dir", str(directory)]) == 0
    token = out.getvalue().strip().split()[-1]
    assert token.startswith("semq_"), out.getvalue()
    return token


@dataclass
class ApiCluster:
    root: Path
    cluster: Cluster = field(init=False)
    urls: dict[str, str] = field(default_factory=dict)  # org -> https://127.0.0.1:PORT
    tokens: dict[str, str] = field(default_factory=dict)  # "A/alice" -> token

    def __post_init__(self) -> None:
        self.cluster = Cluster(self.root, inquiry_interval=0.5)

    def dir(self, org: str) -> Path:
        return self.root / org

    def start(self) -> None:
        c = self.cluster
        for org in (A, B):
            c.add_org(org)
            set_config(self.dir(org), large_from_mib=1)  # documents over 1 MiB travel as large documents
        for org, names in ((A, ("alice", "anna")), (B, ("bob", "bea"))):
            for n in names:
                self.tokens[f"{org}/{n}"] = _token(self.dir(org), n)
        for name, role in (("olga", "operator"), ("vera", "viewer")):
            f = self.root / f"{name}.pw"
            f.write_text(PASSWORD + "\n")
            assert semq_main(["console", "user", "add", name, "--role", role, "--password-file", str(f),
                              "--dir", str(self.dir(A))]) == 0
        c.start_platform()
        for org in (A, B):
            c.start_node(org, "--web", "127.0.0.1:0")
        for org in (A, B):
            self.urls[org] = "https://" + wait_until(lambda o=org: read_status(self.dir(o)).get("web"), 20,  # type: ignore[misc]
                                                     f"the console of {org}")

    def ssl(self, org: str) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.dir(org) / "console" / "console.pem"))

    def client(self, org: str, user: str | None = None, *, token: str | None = None, **kw: Any) -> httpx.Client:
        """An HTTPS client of ``org``'s API, as ``user`` (its token) or with ``token``."""
        headers = dict(kw.pop("headers", {}))
        tok = token if token is not None else (self.tokens[f"{org}/{user}"] if user else None)
        if tok is not None:
            headers["authorization"] = f"Bearer {tok}"
        return httpx.Client(base_url=self.urls[org], verify=self.ssl(org), headers=headers,
                            timeout=kw.pop("timeout", 60.0), follow_redirects=False, **kw)

    def stop(self) -> None:
        self.cluster.stop_all()
