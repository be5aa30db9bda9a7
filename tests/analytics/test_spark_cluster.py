"""`semq report latency --master spark://...` on a real Spark standalone
cluster: a master and one worker on 127.0.0.1, started from pyspark's own
launch classes, give the same report as ``local[*]``.

The logs are those of a real run (a platform and two organizations as real
processes, tests.analytics._runs) together with synthetic logs of skewed
clocks, offline targets, lost and stuck messages (semq.analytics.synth), so
that every table has rows. Both reports run as the command a user runs, in
a subprocess: a JVM's SparkContext is one per process, and a session already
active in the test process would be reused whatever the master.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest

from tests._procs import free_port, wait_until
from tests.analytics._runs import real_run_logs

pytestmark = pytest.mark.spark

ROOT: Final = Path(__file__).resolve().parents[2]
START_TIMEOUT_S: Final = 60
REPORT_TIMEOUT_S: Final = 180

# The python Spark starts for Python work on an executor (PYSPARK_PYTHON):
# the test's own interpreter, through a wrapper that notes each start. The
# report runs no Python on executors (every step is a Spark SQL expression,
# small tables travel as JSON literals: sparkutil._literal_table), so the
# semq package need not be on the executors; the test keeps it so.
_PYTHON_WRAPPER: Final = """#!/bin/sh
echo "$$ $*" >> "{marker}"
exec "{python}" "$@"
"""


def _spark_class(java_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """How to run one of Spark's own classes: pyspark's bin/spark-class, or
    java on its jars. A worker builds its executors' command from SPARK_HOME
    and the Scala version, which spark-class sets and plain java does not."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, **java_env, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": "2.13"}
    spark_class = home / "bin" / "spark-class"
    if spark_class.exists():
        return [str(spark_class)], env
    java = os.path.join(env["JAVA_HOME"], "bin", "java") if env.get("JAVA_HOME") else "java"
    return [java, "-cp", str(home / "jars" / "*")], env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a daemon and the processes it started (an executor the worker ran)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


@contextmanager
def standalone_cluster(tmp_path: Path, python: str) -> Iterator[tuple[str, Path, Path]]:
    """A Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1:
    yields the master URL and the two logs; both are stopped on exit."""
    from semq.analytics.session import find_java

    java_env = {k: v for k, v in find_java().items() if v}
    base, env = _spark_class(java_env)
    env = {k: v for k, v in env.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=python)
    # Not the worktree on the executors' path: they run what the driver sends.
    env.pop("PYTHONPATH", None)
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as f:
            p = subprocess.Popen([*base, *args], stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
                                 start_new_session=True)
        procs.append(p)
        return p

    def ready(p: subprocess.Popen[bytes], log: Path, line: str) -> bool:
        if p.poll() is not None:
            raise AssertionError(f"{log.stem} exited {p.returncode}:\n{log.read_text()[-3000:]}")
        return line in log.read_text(errors="replace")

    try:
        master = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(port), "--webui-port", str(free_port())], master_log)
        wait_until(lambda: ready(master, master_log, f"Starting Spark master at {url}"),
                   START_TIMEOUT_S, "the Spark master", interval=0.2)
        worker = start(["org.apache.spark.deploy.worker.Worker", url, "--cores", "1", "--memory", "1g",
                        "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
                       worker_log)
        wait_until(lambda: ready(worker, worker_log, "Successfully registered with master"),
                   START_TIMEOUT_S, "the worker to register", interval=0.2)
        wait_until(lambda: ready(master, master_log, "Registering worker 127.0.0.1:"),
                   START_TIMEOUT_S, "the master to register the worker", interval=0.2)
        yield url, master_log, worker_log
    finally:
        for p in reversed(procs):
            _stop(p)


def _report(master: str, logs: list[Path], out: Path, python: str) -> str:
    """Run `semq report latency` with `master`, tables to `out`; return the text summary."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        PYSPARK_PYTHON=python,
        # The driver, the master and the worker on one machine: the driver
        # tells the executors its loopback address (the host name may
        # resolve to an address this machine cannot be reached on).
        SPARK_LOCAL_IP="127.0.0.1",
        # No class archive: the first local report would write one as its JVM
        # exits, which is test_analytics_java's subject and costs seconds here.
        SEMQ_CLASS_ARCHIVE="0",
    )
    run = subprocess.run(
        [sys.executable, "-m", "semq", "report", "latency", "--master", master, "--format", "text",
         "--out", str(out), "--stuck-after", "1h", "--logs", *map(str, logs)],
        capture_output=True, text=True, env=env, timeout=REPORT_TIMEOUT_S,
    )
    assert run.returncode == 0, f"{master}: exit {run.returncode}\n{run.stderr[-4000:]}"
    assert f"starting Spark ({master})" in run.stderr
    return run.stdout


def _tables(out: Path) -> dict[str, tuple[str, object]]:
    """Every table the report wrote: its CSV text and its Parquet contents."""
    import pyarrow.parquet as pq

    return {p.stem: (p.read_text(encoding="utf-8"), pq.read_table(p.with_suffix(".parquet")).to_pydict())
            for p in sorted(out.glob("*.csv"))}


def test_a_standalone_cluster_gives_the_local_report(tmp_path: Path) -> None:
    from semq.analytics.synth import SynthConfig, generate

    logs = real_run_logs(tmp_path / "run")
    generate(tmp_path / "synth", SynthConfig(messages=600, orgs=4, seed=5, platform="SYN", direct=0.3))
    logs.append(tmp_path / "synth")
    wrapper = tmp_path / "python"
    marker = tmp_path / "python-starts.txt"
    wrapper.write_text(_PYTHON_WRAPPER.replace("{marker}", str(marker)).replace("{python}", sys.executable))
    wrapper.chmod(0o755)

    with standalone_cluster(tmp_path / "spark", str(wrapper)) as (url, master_log, worker_log):
        on_cluster = _report(url, logs, tmp_path / "cluster", str(wrapper))
        # The job ran on the cluster: the master took the application and the
        # worker started an executor for it.
        assert "Registering app semq-report" in master_log.read_text()
        assert "Asked to launch executor" in worker_log.read_text()
    local = _report("local[*]", logs, tmp_path / "local", str(wrapper))

    assert "messages 650:" in local  # 50 of the real run, 600 synthetic
    assert on_cluster == local
    want, got = _tables(tmp_path / "local"), _tables(tmp_path / "cluster")
    assert len(want) == 14 and got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name
    assert not marker.exists(), (
        "a Python worker ran for the report; the executors then need the semq package "
        f"(docs/analytics.md, 'Running on a cluster'):\n{marker.read_text()}")
