"""What a reload (SIGHUP, ``semq admin reload``) does to a running daemon
(docs/operations.md, "Reload"): the settings changed in ``semq.toml``
since the last load are applied — a node's inquiry interval, window (its
running session too), platform address and clock skew; the platform's
queue, quota, window, connection limit and auto-registration — command-line
overrides stay while the file does not change the key, the keys that need
a restart are named, and a file with a wrong value changes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.node.core import NodeCore
from semq.node.daemon import NodeDaemon, NodeSettings
from semq.ops.reload import node_reloader, platform_reloader
from semq.platform.core import PlatformCore
from semq.platform.daemon import PlatformDaemon, PlatformSettings
from semq.settings.config import ConfigError

A = "10008"


def set_keys(d: Path, **keys: str) -> None:
    """Replace (or add) ``key = value`` lines of d/semq.toml (TOML text)."""
    p = d / "semq.toml"
    text = p.read_text()
    for key, value in keys.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", lambda _m, k=key, v=value: f"{k} = {v}", text)  # type: ignore[misc]
        if not n:
            text += f"{key} = {value}\n"
    p.write_text(text)


async def test_a_node_reload_applies_what_changed_and_a_wrong_value_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security", "--platform",
                      "127.0.0.1:7410"]) == 0
    core = NodeCore(d / "node.sqlite", A)
    try:
        daemon = NodeDaemon(core, NodeSettings(window=4096))
        daemon.platform_window = daemon.granted = daemon.window = 4096  # a session: WELCOME(window=4096)
        core.inquiry_ms = 9000  # as 'semq node run --inquiry-interval 9' set it
        reload = node_reloader(daemon, core, d)
        assert await reload() == {"changed": {}}
        assert core.inquiry_ms == 9000  # the override stays: the file did not change the key

        set_keys(d, window="64", clock_skew="60.0", platform='"127.0.0.1:7999"')
        changed = (await reload())["changed"]
        assert set(changed) == {"window", "clock_skew", "platform"}
        assert (daemon.s.window, daemon.window) == (64, 64)  # the running session too
        assert core.skew_ms == 60_000 and (daemon.s.host, daemon.s.port) == ("127.0.0.1", 7999)
        assert core.inquiry_ms == 9000
        set_keys(d, platform='"127.0.0.1:7999, [::1]:7998"')  # several: all of them, in order
        assert (await reload())["changed"]["platform"].startswith("127.0.0.1:7999, [::1]:7998")
        assert [str(a) for a in daemon.s.addresses] == ["127.0.0.1:7999", "[::1]:7998"]

        set_keys(d, inquiry_interval="2.0", synchronous='"NORMAL"')
        changed = (await reload())["changed"]
        assert changed["inquiry_interval"] == 2.0 and core.inquiry_ms == 2000
        assert changed["needs_restart"] == ["synchronous"]

        set_keys(d, inquiry_interval="5.0", window="0")  # a wrong value: nothing is applied
        with pytest.raises(ConfigError, match="window = 0 is out of range"):
            await reload()
        assert (core.inquiry_ms, daemon.s.window, daemon.window) == (2000, 64, 64)
        set_keys(d, window="128")  # fixed: both changes are applied now
        changed = (await reload())["changed"]
        assert (changed["inquiry_interval"], changed["window"]) == (5.0, 128) and core.inquiry_ms == 5000
    finally:
        core.close()


async def test_a_platform_reload_applies_what_changed_and_names_what_needs_a_restart(tmp_path: Path) -> None:
    d = tmp_path / "P"
    assert semq_main(["platform", "init", "--dir", str(d), "--no-security"]) == 0
    core = PlatformCore(d / "platform.sqlite")
    try:
        daemon = PlatformDaemon(core, PlatformSettings())
        reload = platform_reloader(daemon, core, d)
        set_keys(d, queue_mib="4", quota_mib="1", window="256", max_connections_per_org="2",
                 auto_register="false", inquiry_interval="3.0", listen='"127.0.0.1:7555"')
        changed = (await reload())["changed"]
        assert daemon.s.high_water == 4 << 20 and core.quota_bytes == 1 << 20
        assert daemon.s.window == 256 and daemon.s.max_connections_per_org == 2
        assert core.auto_register is False and core.inquiry_ms == 3000
        assert changed["needs_restart"] == ["listen"]
        set_keys(d, queue_mib='"lots"')
        with pytest.raises(ConfigError, match="queue_mib"):
            await reload()
        assert daemon.s.high_water == 4 << 20
    finally:
        core.close()
