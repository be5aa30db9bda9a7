"""What ``NodeClient.send_file`` refuses for a large document, before
anything is stored: a file over ``max_document_mib`` (its size and the
limit), a user of this node, an ordered channel, best effort, and a node
that sends over direct links only (large documents go through the
platform). Each is one line, and the outbox and ``large/out`` stay empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.limits import DocumentRefused
from tests._procs import set_config

MIB = 1 << 20


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / "A"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    return d


@pytest.mark.parametrize(("to", "options", "config", "words"), [
    ("56001", {}, {"max_document_mib": 4}, "exceeds"),
    ("alice", {}, {}, "cannot go to a user of this node (at most 4 MiB)"),
    ("56001", {"ordered": "orders"}, {}, "cannot be in an ordered channel (at most 4 MiB)"),
    ("56001", {"reliable": False}, {}, "cannot be sent best effort"),
    ("56001", {}, {"direct": "only"}, 'sends over direct links only (direct = "only"); at most 4 MiB go over'),
])
def test_a_large_document_is_refused_at_send_with_nothing_stored(
        node: Path, tmp_path: Path, to: str, options: dict[str, object], config: dict[str, object],
        words: str) -> None:
    if config:
        set_config(node, **config)
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        f.truncate(5 * MIB)
    with NodeClient(node) as client:
        client.add_user("alice")
        with pytest.raises((DocumentRefused, ValueError)) as e:
            client.send_file(to, src, data_type="CAD", **options)
        assert words in str(e.value) and "\n" not in str(e.value)
        assert client.messages() == []
    copies = node / "large" / "out"
    assert not copies.is_dir() or not any(copies.iterdir())
