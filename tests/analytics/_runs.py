"""Event logs of a real run, for the report tests: a platform and two
organizations as real processes on 127.0.0.1 (tests._procs), security on."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FORWARDED", "STORED", "real_run_logs"]

STORED = 20  # documents sent while the target was offline: stored at the platform
FORWARDED = 30  # documents sent while it was online: forwarded at once


def real_run_logs(root: Path) -> list[Path]:
    """Run the platform and organizations 10008 and 56001 under `root` until
    every document is confirmed and cleaned up; return the three ``events``
    directories (platform, origin, receiver). The processes are killed on return."""
    from semq.node.api import NodeClient
    from tests._procs import Cluster, wait_until

    c = Cluster(root)
    try:
        for o in ("10008", "56001"):
            c.add_org(o)
        c.start_platform()
        c.start_node("10008")
        with NodeClient(c.root / "10008") as node:  # B offline: stored at the platform
            node.send_many([dict(to="56001", data=b"<order/>", data_type="ORDER", domain="trade",
                                 key=f"S{i}") for i in range(STORED)])
        wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=1") == STORED, 30,
                   "stored")
        c.start_node("56001")
        with NodeClient(c.root / "10008") as node:  # B online: forwarded at once
            node.send_many([dict(to="56001", data=b"<invoice/>", data_type="INVOICE", domain="trade",
                                 key=f"I{i}") for i in range(FORWARDED)])
        wait_until(lambda: c.settled(["10008", "56001"]), 60, "everything confirmed and cleaned up")
    finally:
        c.stop_all()
    return [c.root / d / "events" for d in ("P", "10008", "56001")]
