"""The Grafana dashboard shipped in the package: every metric its queries
name is one a real Metrics object serves (compared with the rendered
exposition, suffixes as prometheus_client writes them); panel ids are
unique and every panel queries the dashboard's data-source variable;
``semq admin grafana-dashboard`` prints or writes it."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.ops.metrics import Metrics, grafana_dashboard

DATASOURCE_VAR = "${DS_PROMETHEUS}"
_METRIC = re.compile(r"\bsemq_[A-Za-z0-9_]*")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)")


def dashboard() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(grafana_dashboard())
    return d


def all_panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in d.get("panels", []):
        yield p
        yield from p.get("panels", [])


def queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    out = []
    for p in all_panels(d):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"]))
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        out.append((f"variable {v['name']}", q))
        out.append((f"variable {v['name']} definition", v.get("definition", "")))
    return out


def named_metrics(d: dict[str, Any]) -> dict[str, list[str]]:
    """metric name -> where the dashboard uses it."""
    used: dict[str, list[str]] = {}
    for where, expr in queries(d):
        for name in _METRIC.findall(expr):
            used.setdefault(name, []).append(where)
    return used


def fed(role: str) -> Metrics:
    """A Metrics object fed so that every labelled series has a sample."""
    m = Metrics(role, "10008" if role == "node" else "platform")
    now = int(time.time() * 1000)
    if role == "node":
        m.observe_events([
            {"ts": now - 900, "role": "origin", "event": "sent", "lk0": "o/1/1/7"},
            {"ts": now - 800, "role": "origin", "event": "ack_save", "lk0": "o/1/1/7"},
            {"ts": now, "role": "origin", "event": "ack2", "lk0": "o/1/1/7"},
            {"ts": now, "role": "origin", "event": "resend", "lk0": "o/1/1/8"},
            {"ts": now, "role": "origin", "event": "inquiry"},
            {"ts": now, "role": "origin", "event": "nack"},
            {"ts": now, "role": "receiver", "event": "received", "created_ms": now - 300},
            {"ts": now, "role": "receiver", "event": "inbox", "created_ms": now - 200},
            {"ts": now, "role": "receiver", "event": "duplicate"},
        ])
        m.set_snapshot({"messages": {("outbox", "SS_INIT"): 1, ("inbound", "pending_ack"): 0},
                        "oldest_ms": now - 5000, "stuck": 0, "bytes": 4096})
    else:
        m.observe_events([
            {"ts": now, "event": "received", "lk0": "a/1/1/1", "created_ms": now - 250},
            {"ts": now, "event": "forwarded", "lk0": "a/1/1/1"},
            {"ts": now, "event": "stored", "lk0": "a/1/1/2"},
            {"ts": now, "event": "dropped"},
            {"ts": now, "event": "delivered", "attempt": 2},
            {"ts": now, "event": "acked"},
            {"ts": now, "event": "inquiry"},
        ])
        m.set_snapshot({"messages": {("stored", "SS_INIT"): 1, ("relayed", "waiting"): 0},
                        "oldest_ms": now - 5000, "stuck": 1, "bytes": 8192})
        m.set_nodes({"10008": now - 60_000, "56001": now}, ["56001"])
    m.connections.set(1)
    m.observe_batch(16, 0.002)
    m.observe_loop_lag(0.001)
    m.count("frames_in", 3)
    return m


def exposed(m: Metrics) -> set[str]:
    """The sample names in the rendered exposition text (not the # lines)."""
    names = set()
    for line in m.render().decode().splitlines():
        if line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            names.add(match.group(1))
    return names


@pytest.fixture(scope="module")
def served() -> set[str]:
    return exposed(fed("node")) | exposed(fed("platform"))


def unknown(d: dict[str, Any], served: set[str]) -> dict[str, list[str]]:
    return {n: w for n, w in named_metrics(d).items() if n not in served}


def test_every_metric_in_the_dashboard_is_served(served: set[str]) -> None:
    d = dashboard()
    used = named_metrics(d)
    assert not unknown(d, served), "the dashboard names metrics the daemons do not serve:\n" + "\n".join(
        f"{n}: {', '.join(w)}" for n, w in sorted(unknown(d, served).items()))
    # the suffixes are the exposition's: counters _total, histograms _bucket/_sum/_count
    assert {"semq_events_total", "semq_hop_latency_seconds_bucket", "semq_e2e_latency_seconds_sum",
            "semq_e2e_latency_seconds_count", "semq_node_online"} <= set(used)
    assert "semq_events" not in served and "semq_hop_latency_seconds" not in served


def test_every_served_metric_has_a_panel(served: set[str]) -> None:
    # Each family (semq_x from semq_x_total / _bucket / ...) appears in some query.
    used = set(named_metrics(dashboard()))
    families = {re.sub(r"_(total|created|bucket|sum|count)$", "", n) for n in served}
    charted = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert families - charted == set()


def test_a_misspelled_metric_is_caught(served: set[str]) -> None:
    d = copy.deepcopy(dashboard())
    assert not unknown(d, served)
    panel = next(p for p in all_panels(d) if p.get("targets"))
    panel["targets"][0]["expr"] = "sum(rate(semq_nonexistent_total[5m])) + sum(semq_events)"
    d["templating"]["list"][-1]["definition"] = "label_values(semq_forwarded, job)"
    assert set(unknown(d, served)) == {"semq_nonexistent_total", "semq_events", "semq_forwarded"}


def test_panels_ids_and_datasource() -> None:
    d = dashboard()
    assert d["schemaVersion"] >= 39 and d["uid"] and d["title"]
    panels = list(all_panels(d))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    charts = [p for p in panels if p["type"] != "row"]
    assert len(charts) >= 20
    for p in charts:
        assert p["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, p["title"]
            assert t["expr"].strip() and t["refId"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"job", "instance", "role"} <= set(variables)
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, v["name"]
    # every chart filters by the job and instance variables
    for where, expr in queries(d):
        if where.startswith("panel"):
            assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, where


def test_the_cli_prints_and_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert semq_main(["admin", "grafana-dashboard"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == dashboard()
    f = tmp_path / "semq.json"
    assert semq_main(["admin", "grafana-dashboard", "-o", str(f)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and str(f) in captured.err
    assert f.read_text("utf-8") == out
    assert semq_main(["admin", "grafana-dashboard", "-o", str(tmp_path / "no" / "such" / "dir.json")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_shipped_as_package_data() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    globs = data["tool"]["setuptools"]["package-data"]["semq.ops"]
    assert any((root / "semq" / "ops").glob(g) for g in globs)
    assert (root / "semq" / "ops" / "grafana" / "semq-dashboard.json").exists()
