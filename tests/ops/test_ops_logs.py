"""Operational logs: JSON lines and key=value, levels, a 0600 file, and the
redaction of payloads and key material."""

from __future__ import annotations

import io
import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.ops.logs import RedactFilter, configure_logging, redact

PEM = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ0kPd0rZ4y2XnY1yrGkX8l0hD3f9Xq+Lq2K0Yx8aBcD\n-----END PRIVATE KEY-----"
B64 = "QmFzZTY0IGVuY29kZWQgc2Vzc2lvbiBrZXkgbWF0ZXJpYWwgdGhhdCBtdXN0IG5vdCBsZWFr"


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
        for f in [f for f in h.filters if isinstance(f, RedactFilter)]:
            h.removeFilter(f)
    root.setLevel(level)


def test_json_lines_redacted(tmp_path: Path) -> None:
    buf = io.StringIO()
    log_file = tmp_path / "logs" / "semq.log"
    configure_logging("INFO", "json", log_file, stream=buf)
    log = logging.getLogger("semq.test")
    log.debug("hidden at INFO")
    log.info("document %s for %s", b"ORDER S0001: 100 widgets at 9.99", "56001")
    log.warning("loaded key %s", PEM)
    log.info("session key %s", B64, extra={"app_data": "the order text", "lk0": "10008/1/1/42", "blob": b"\x00" * 9})
    log.error("repr %r", b"confidential invoice payload")
    try:
        raise ValueError(f"cannot parse {PEM}")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [x["level"] for x in lines] == ["INFO", "WARNING", "INFO", "ERROR", "ERROR"]
    assert lines[0]["msg"] == "document <32 bytes> for 56001" and lines[0]["logger"] == "semq.test"
    assert lines[1]["msg"] == "loaded key [PEM redacted]"
    assert lines[2]["msg"] == "session key [redacted]"
    assert lines[2]["app_data"] == "[redacted]" and lines[2]["lk0"] == "10008/1/1/42" and lines[2]["blob"] == "<9 bytes>"
    assert lines[3]["msg"] == "repr '<28 bytes>'"
    assert "[PEM redacted]" in lines[4]["exc"] and "BEGIN" not in lines[4]["exc"]
    everything = buf.getvalue() + log_file.read_text()
    for secret in ("widgets", "MC4CAQAw", B64, "the order text", "confidential"):
        assert secret not in everything
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert len(log_file.read_text().splitlines()) == 5


def test_key_value_and_reconfigure() -> None:
    buf = io.StringIO()
    configure_logging("warning", "text", stream=buf)
    configure_logging("WARNING", "text", stream=buf)  # replaces, does not duplicate
    logging.getLogger("semq.node").warning("platform %s:%d unreachable", "127.0.0.1", 7410, extra={"attempt": 3})
    (line,) = buf.getvalue().splitlines()
    assert " level=WARNING logger=semq.node msg=\"platform 127.0.0.1:7410 unreachable\" attempt=3" in line
    assert line.startswith("ts=")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("LOUD", "text")


def test_redact_keeps_identifiers() -> None:
    keep = ("10008/1/1/42 trade/ORDER/PO/S0001 code 301 /var/lib/semq/organizations/acme-corporation-eu/keys"
            " 127.0.0.1:7410")
    assert redact(keep) == keep
    assert redact("digest " + "ab" * 32) == "digest [redacted]"
    assert redact("b'" + "x" * 20 + "'") == "[bytes redacted]"
