"""The ``semq`` command. ``main(argv) -> int``: 0 ok, 1 a runtime failure,
2 a user's mistake; errors are one line on stderr (``--verbose`` for the
traceback)."""

from __future__ import annotations

import argparse
import errno
import gc
import json
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NoReturn

from semq import __version__
from semq.cli.bulk import BULK_BATCH, format_size
from semq.cli.content import write_content
from semq.cli.watch import register as register_watch
from semq.identity.crypto import CryptoError
from semq.identity.security import AlreadyEnrolled, SecurityError
from semq.ops.cli import register as register_ops
from semq.ops.display import MAX_LIMIT, age, check_count, is_time_key, shown, when
from semq.ops.runtime import add_run_options
from semq.session.transport import parse_hostport
from semq.settings.config import (
    PRIVATE_DIR_MODE,
    Address,
    Config,
    ConfigError,
    check_option,
    check_org,
    check_private_paths,
    data_dir,
    load_config,
    parse_platform_addresses,
    write_config,
)
from semq.store.db import StoreError
from semq.umxt_protocol import ProtocolError, SaveFwd

__all__ = ["main"]


class UsageError(Exception):
    pass


def _dir(args: argparse.Namespace) -> Path:
    return data_dir(getattr(args, "dir", None))


def _cfg(args: argparse.Namespace, role: str | None = None) -> Config:
    cfg = load_config(_dir(args))
    if role and cfg.role != role:
        raise UsageError(f"{cfg.directory} holds a {cfg.role}, not a {role}")
    return cfg


def format_age(ms: int | None) -> str:
    """How long ago a ms timestamp was, for tables: 42s, 17m, 3.5h, 2.0d."""
    return age(ms)


# ---------------------------------------------------------------- init


def cmd_platform_init(args: argparse.Namespace) -> int:
    from semq.platform.core import PlatformCore

    d = _dir(args)
    if (d / "semq.toml").exists():
        raise UsageError(f"{d} already holds a configuration; refusing to overwrite it")
    check_option("listen", require_port(args.listen, "--listen"), "--listen")
    check_option("platform_id", args.id, "--id")
    host, _ = parse_hostport(args.listen)
    if args.store:
        check_option("store", args.store, "--store")
    cfg = Config(role="platform", directory=d, listen=args.listen, platform_id=args.id,
                 security=not args.no_security, store=args.store or "")
    if cfg.store:  # a database it cannot reach leaves no configuration behind
        PlatformCore(cfg.platform_store, cfg.platform_id, create=True).close()
    write_config(cfg)
    PlatformCore(cfg.platform_store, cfg.platform_id, create=True).close()
    if cfg.security:
        from semq.identity.security import init_platform_pki

        names = list(dict.fromkeys(["127.0.0.1", "::1", "localhost", host, *args.name]))
        init_platform_pki(d, cfg.platform_id, names[3:])
        print(f"platform {cfg.platform_id} initialised in {d} (listen {cfg.listen}); CA in {d / 'ca'},"
              f" TLS certificate for {', '.join(names)}")
    else:
        print(f"platform {cfg.platform_id} initialised in {d} (listen {cfg.listen}); security OFF:"
              " plain TCP, no end-to-end encryption or signatures")
    return 0


def cmd_platform_migrate(args: argparse.Namespace) -> int:
    from semq.platform.migrate import MigrateRefused, migrate_to_pg
    from semq.store.pg import redact

    check_option("store", args.to, "--to")
    cfg = _cfg(args, "platform")

    def progress(table: str, done: int, total: int) -> None:
        print(f"{table}: {done}/{total} rows ({100 * done // max(total, 1)}%)", file=sys.stderr, flush=True)

    try:
        info = migrate_to_pg(cfg, args.to, progress=progress)
    except MigrateRefused as e:
        raise UsageError(str(e)) from None
    rows = ", ".join(f"{t} {n}" for t, n in info.rows.items())
    ca = f"; CA files in the store: {info.ca_files}" if cfg.security else ""
    print(f"migrated {info.sqlite} to {info.url} in {info.seconds:.2f} s: rows {rows}{ca};"
          f" next stored copy id {info.next_id}")
    print(f'{info.config} now names store = "{redact(args.to)}"; {info.sqlite} is kept unchanged:'
          " delete it once the platform runs well on PostgreSQL")
    return 0


def cmd_node_init(args: argparse.Namespace) -> int:
    """``semq node init``: all or nothing. A failure (a platform directory
    that is not one, an enrolment refused, a full disk) leaves no
    half-made node behind: a directory it created is removed, one that was
    there keeps only what it held before."""
    d = _dir(args)
    if (d / "semq.toml").exists():
        raise UsageError(f"{d} already holds a configuration; refusing to overwrite it")
    before = set(os.listdir(d)) if d.is_dir() else None
    try:
        return _node_init(args, d)
    except BaseException:
        _undo(d, before)
        raise


def _undo(d: Path, before: set[str] | None) -> None:
    """Remove what a failed init made in ``d``: all of it if ``before`` is
    None (it made ``d``), else the entries not in ``before``."""
    import shutil

    if before is None:
        shutil.rmtree(d, ignore_errors=True)
        return
    try:
        made = set(os.listdir(d)) - before
    except OSError:
        return
    for name in made:
        p = d / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _node_init(args: argparse.Namespace, d: Path) -> int:
    from semq.node.store import open_node_store

    check_org(args.org, "--org")
    check_option("platform", args.platform, "--platform")
    if args.listen:
        require_port(args.listen, "--listen")
    direct = {"direct_listen": args.listen or "", "direct": args.direct, "direct_from": args.direct_from or "",
              "direct_announce": args.announce or ""}
    for key, flag in (("direct_listen", "--listen"), ("direct", "--direct"), ("direct_from", "--direct-from"),
                      ("direct_announce", "--announce")):
        check_option(key, direct[key], flag)
    check_option("units", str(args.units), "--units")
    if args.listen and args.units > 1:
        raise UsageError(f"--listen with --units {args.units}: a node of several units takes no direct links")
    if args.listen and args.no_security:
        raise UsageError("--listen needs security: direct links are mutual TLS between the nodes' certificates")
    if args.enroll_from and not args.no_security:
        from semq.identity.security import check_not_enrolled

        pdir = data_dir(args.enroll_from)
        if _cfg_of(pdir, "--enroll-from").role != "platform":  # before anything is written
            raise UsageError(f"--enroll-from {pdir} holds a node, not a platform")
        check_not_enrolled(pdir, args.org)
    cfg = Config(role="node", directory=d, org=args.org, platform=args.platform, security=not args.no_security,
                 units=args.units, **direct)
    write_config(cfg)
    # A new incarnation: its record ids start at its creation time, above
    # any an earlier store of this organization sent (docs/exactly-once.md).
    # Each unit has its own store (semq.umxt_protocol.units).
    for k in range(1, cfg.units + 1):
        ucfg = cfg.for_unit(k)
        ucfg.unit_dir.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        open_node_store(ucfg.store_path, create=True, incarnation="init").close()
    print(f"node {cfg.org} initialised in {d} (platform {cfg.platform}"
          f"{f'; {cfg.units} units' if cfg.units > 1 else ''}"
          f"{f'; direct links on {cfg.direct_listen}' if cfg.direct_listen else ''})")
    if not cfg.security:
        print("security OFF: plain TCP, no end-to-end encryption or signatures")
        return 0
    from semq.identity.security import enroll, import_certificate, init_node_keys

    csr = init_node_keys(d, cfg.org)
    if args.enroll_from:
        pdir = data_dir(args.enroll_from)
        org, cert = enroll(pdir, csr, cfg.org, d / "issued.pem")
        import_certificate(d, cert, pdir / "ca" / "ca.pem")
        _register(pdir, [org], cfg.units if cfg.units > 1 else None)
        print(f"enrolled with the platform in {pdir}: certificate installed"
              f"{f'; granted {cfg.units} units' if cfg.units > 1 else ''}")
    else:
        print(f"keys written; certificate request {csr}\nnext: the platform operator runs"
              f" 'semq platform enroll {csr.name} --out {cfg.org}.pem', then here:"
              f" 'semq node import --cert {cfg.org}.pem --ca <platform>/ca/ca.pem'")
    return 0


def _cfg_of(directory: Path, option: str) -> Config:
    """The configuration of a directory named by ``option``; a missing one
    says which option named it."""
    if not (directory / "semq.toml").exists():
        raise UsageError(f"{option} {directory}: no configuration there (semq.toml); name the platform's"
                         " data directory")
    return load_config(directory)


def _units_option(units: int | None) -> int | None:
    """``--units N`` of register / enroll, checked as the ``units`` key is."""
    if units is not None:
        check_option("units", str(units), "--units")
    return units


def _register(pdir: Path, orgs: list[str], units: int | None = None) -> None:
    from semq.platform.core import PlatformCore

    cfg = load_config(pdir)
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.register(orgs, units)
        core.share_ca(pdir / "ca")  # (PostgreSQL store: every instance gets the new certificate)
    finally:
        core.close()


def cmd_platform_enroll(args: argparse.Namespace) -> int:
    from semq.identity.security import enroll

    cfg = _cfg(args, "platform")
    org, path = enroll(cfg.directory, Path(args.csr), args.org, Path(args.out) if args.out else None,
                       rollover=args.rollover)
    _register(cfg.directory, [org], _units_option(args.units))
    print(f"issued a certificate for organization {org}: {path}\n"
          f"give it and {cfg.directory / 'ca' / 'ca.pem'} to the organization:"
          f" semq node import --cert {path.name} --ca ca.pem")
    return 0


def cmd_platform_revoke(args: argparse.Namespace) -> int:
    from semq.identity.security import revoke
    from semq.platform.core import PlatformCore

    cfg = _cfg(args, "platform")
    if not args.serial and not args.org:
        raise UsageError("name the organization to revoke (or --serial HEX)")
    try:
        target: str | int = int(args.serial, 16) if args.serial else args.org
    except ValueError:
        raise UsageError(f"serial {args.serial!r} is not hexadecimal") from None
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.share_ca(cfg.directory / "ca")  # (PostgreSQL store: revoke on the newest list of every instance)
        try:
            serials = revoke(cfg.directory, target)
        except CryptoError as e:
            raise UsageError(str(e)) from None
        if not args.serial:
            with core.db.atomic("IMMEDIATE"):
                core.conn.execute("UPDATE nodes SET revoked=1 WHERE node_id=?", (args.org,))
        core.share_ca(cfg.directory / "ca")
    finally:
        core.close()
    print(f"revoked {len(serials)} certificate(s) ({', '.join(f'{s:x}' for s in serials)});"
          " a running platform picks the new revocation list up within seconds")
    return 0


def cmd_node_rollover(args: argparse.Namespace) -> int:
    """Certificate rollover: new keys and a request; the old identity keeps
    working (and keeps opening documents sealed to it) through the overlap."""
    from semq.identity.security import enroll, import_certificate, rollover_keys

    cfg = _cfg(args, "node")
    if not cfg.security:
        raise UsageError("security is off for this node: there is no certificate to roll over")
    csr = rollover_keys(cfg.directory, cfg.org, endorse=not args.no_endorse)
    if args.enroll_from:
        pdir = data_dir(args.enroll_from)
        _, cert = enroll(pdir, csr, cfg.org, cfg.directory / "next" / "issued.pem", rollover=True)
        ident = import_certificate(cfg.directory, cert, pdir / "ca" / "ca.pem")
        print(f"rolled over: now {ident.certificate.describe()}; the previous certificate stays usable"
              " for documents sealed to it until it expires (restart the daemon to use the new one)"
              f"\nfingerprint: {ident.certificate.fingerprint}")
        return 0
    print(f"new keys and request {csr}\nnext: the platform operator runs 'semq platform enroll --rollover"
          f" {csr.name} --out {cfg.org}-new.pem', then here: 'semq node import --cert {cfg.org}-new.pem --ca ca.pem'")
    return 0


def cmd_node_trust(args: argparse.Namespace) -> int:
    """The certificates of another organization this node trusts (pinned on
    first use; semq.identity.trust), and the ones it refused; accept one, or forget one."""
    from semq.identity.trust import PinStore

    cfg = _cfg(args, "node")
    if not cfg.security:
        raise UsageError("security is off for this node: it pins no certificates")
    from semq.umxt_protocol import Endpoint

    Endpoint.org(args.org)
    store = PinStore(cfg.directory)
    if args.forget:
        pin = store.forget(args.org, args.forget)
        print(f"no longer trusted for organization {args.org}: {pin.fingerprint}; a running daemon stops using it"
              " within seconds")
        return 0
    if args.fingerprint:
        pin = store.trust(args.org, args.fingerprint)
        print(f"trusted for organization {args.org}: {pin.fingerprint} ({pin.how}); a running daemon uses it"
              " within seconds")
        return 0
    pins, refused = store.pins(args.org), store.refusals(args.org)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"org": args.org, "pinned": [asdict(p) for p in pins],
                          "refused": [asdict(r) for r in refused]}))
        return 0
    if not pins and not refused:
        print(f"organization {args.org}: nothing pinned yet (its certificates are pinned when first used)")
        return 0
    print(f"organization {args.org}:")
    for p in pins:
        print(f"  pinned   {p.fingerprint}  serial {p.serial or '?'}  since {p.first_seen or 'not seen yet'}"
              f"  ({p.how})")
    for r in refused:
        print(f"  REFUSED  {r.fingerprint}  serial {r.serial}  since {r.first_seen}  ({r.why})")
    if refused:
        print(f"compare a refused fingerprint with {args.org} out of band; to accept it:"
              f" semq node trust {args.org} FINGERPRINT")
    return 0


def cmd_node_import(args: argparse.Namespace) -> int:
    from semq.identity.security import import_certificate

    cfg = _cfg(args, "node")
    ident = import_certificate(cfg.directory, Path(args.cert), Path(args.ca))
    if ident.org != cfg.org:
        raise UsageError(f"certificate is for organization {ident.org}, this node is {cfg.org}")
    print(f"installed: {ident.certificate.describe()}\nfingerprint: {ident.certificate.fingerprint}")
    return 0


def cmd_platform_register(args: argparse.Namespace) -> int:
    from semq.platform.core import PlatformCore

    cfg = _cfg(args, "platform")
    units = _units_option(args.units)
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.register(args.orgs, units)
    finally:
        core.close()
    print(f"registered {', '.join(args.orgs)}{f' (granted {units} units each)' if units else ''}")
    return 0


# ---------------------------------------------------------------- daemons


def _write_status(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, owner-only (0600) like the
    rest of a data directory (it names the platform, partners and ports):
    written to a 0600 temporary file, then renamed over it, so a reader
    never sees half of it and it is never readable by others. Not synced:
    it is rewritten every second and means nothing after a crash."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # (a .tmp left by an older version may have been 0644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _run_daemon(cfg: Config, make: Callable[[], Any], status: Callable[[Any], dict[str, Any]],
                ready: Callable[[Any], str], ops: Any = None) -> int:
    import trio

    async def amain() -> None:
        daemon = make()
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                result = await nursery.start(daemon.run)
                if ops is not None:  # admin socket, metrics, SIGHUP reload, drain (semq.ops)
                    await ops.start(nursery, daemon)
                tune_gc()
                print(ready(result), flush=True)

                async def report() -> None:
                    while True:
                        try:
                            _write_status(cfg.status_path, {"pid": os.getpid(), "time_ms": int(time.time() * 1000),
                                                            **status(daemon), **(ops.status() if ops else {})})
                        except OSError as e:  # e.g. disk full: keep serving, say so
                            logging.getLogger("semq").warning("cannot write %s: %s", cfg.status_path, e)
                        await trio.sleep(1)

                nursery.start_soon(report)

                async def until_signal(scope: trio.CancelScope) -> None:
                    async for sig in signals:
                        logging.getLogger("semq").info("signal %d: stopping", sig)
                        break
                    scope.cancel()

                async with trio.open_nursery() as waiting:
                    waiting.start_soon(until_signal, waiting.cancel_scope)
                    if ops is not None:  # 'semq admin stop', or a drain that finished
                        await ops.drain.wait_stop()
                        waiting.cancel_scope.cancel()
                # Stop accepting; in-flight store calls finish (the gate's
                # threads are never abandoned), then exit 0.
                nursery.cancel_scope.cancel()
        cfg.status_path.unlink(missing_ok=True)

    try:
        trio.run(amain)
    except* OSError as eg:
        # e.g. the listen address is in use: one line, not a traceback.
        first = _first_leaf(eg)
        if first.errno == errno.EADDRINUSE:  # taken after check_free looked
            raise AddressInUse(f"an address this daemon is to listen on is in use ({first.strerror}); another"
                               f" instance may be running (semq status --dir {cfg.directory})") from None
        raise first from None
    return 0


def _first_leaf(eg: BaseExceptionGroup[OSError]) -> OSError:
    """The first exception of a (nested) exception group."""
    e: BaseException = eg
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    assert isinstance(e, OSError)
    return e


def _inquiry_interval(args: argparse.Namespace, cfg: Config) -> float:
    """``--inquiry-interval``, checked like the configuration's key, else
    the configuration's; also checks ``--listen`` / ``--platform``."""
    for name in ("listen", "platform"):
        if getattr(args, name, None) is not None:
            check_option(name, getattr(args, name), f"--{name}")
    if args.inquiry_interval is None:
        return cfg.inquiry_interval
    return float(check_option("inquiry_interval", args.inquiry_interval, "--inquiry-interval"))


def cmd_platform_run(args: argparse.Namespace, daemon_class: Any = None) -> int:
    """``semq platform run``. ``daemon_class`` (default PlatformDaemon)
    lets a test tool run the same relay with its own daemon subclass
    (semq.testing.dishonest)."""
    from semq.platform.core import PlatformCore
    from semq.platform.daemon import PlatformDaemon, PlatformSettings

    daemon_class = daemon_class or PlatformDaemon

    cfg = _cfg(args, "platform")
    if args.listen is not None:
        require_port(args.listen, "--listen")
    inquiry_interval = _inquiry_interval(args, cfg)
    host, port = parse_hostport(args.listen or cfg.listen)
    check_private_paths(cfg)  # like the keys: a store others can read is refused
    check_free((host, port), "--listen" if args.listen else f"listen in {cfg.directory / 'semq.toml'}",
               cfg.directory)
    _check_ops_addresses(args, cfg.directory)
    _raise_fd_limit()
    security = None
    if cfg.security:
        from semq.identity.security import PlatformSecurity

        security = PlatformSecurity(cfg.directory)
    instance = ""
    if cfg.store:  # one of several instances on one PostgreSQL store
        from semq.platform.cluster import new_instance_id

        instance = new_instance_id()
    core = PlatformCore(cfg.platform_store, cfg.platform_id, events_dir=cfg.events_dir, synchronous=cfg.synchronous,
                        check=True, instance=instance,
                        inquiry_interval=inquiry_interval,
                        # With certificates, only enrolled organizations are known.
                        auto_register=cfg.auto_register and not cfg.security,
                        quota_bytes=max(0, cfg.quota_mib) << 20)
    if instance and cfg.security:  # before serving: the same CA as the other instances (one line if not)
        try:
            core.share_ca(cfg.directory / "ca")
        except BaseException:
            core.close()
            raise
    settings = PlatformSettings(host=host, port=port, window=cfg.window, security=security,
                                high_water=max(1, cfg.queue_mib) << 20,
                                max_connections_per_org=cfg.max_connections_per_org,
                                max_units_per_org=cfg.max_units_per_org, max_connections=cfg.max_connections,
                                max_handshakes=cfg.max_handshakes, fd_reserve=cfg.fd_reserve,
                                max_buffer_per_org=cfg.max_buffer_mib_per_org << 20)
    from semq.ops.runtime import OpsRuntime, ops_options

    ops = OpsRuntime("platform", cfg.directory, core, ops_options(args), history_days=cfg.history_days)
    try:
        return _run_daemon(
            cfg, lambda: daemon_class(core, settings),
            lambda d: {"role": "platform", "listen": f"{host}:{d.port}",
                       "online": sorted(ep.node_id for ep in d.sessions), **d.stats},
            lambda port_: f"platform {cfg.platform_id} listening on {host}:{port_}",
            ops,
        )
    finally:
        ops.close()
        core.close()


GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """For a daemon, once started: the ~40,000 objects of start-up (modules,
    classes, caches) leave the cyclic collector's sight (gc.freeze), and a
    young collection waits for 10,000 new container objects instead of 700.
    A document allocates a few dozen short-lived dicts and tuples, almost
    none in cycles; with the defaults a relay ran ~30 young collections per
    1,000 documents and a full one (8 ms, all of start-up again, the loop
    stopped meanwhile) every few thousand: ~5% of the cores' CPU
    (scripts/bench pipeline) and a latency spike each time.
    ``SEMQ_GC_DEFAULTS=1`` keeps Python's defaults (for comparisons)."""
    if os.environ.get("SEMQ_GC_DEFAULTS") == "1":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class AddressInUse(OSError):
    """An address a daemon is to listen on is taken (exit status 1)."""


def require_port(text: str, option: str) -> str:
    """A listening address given on the command line must say its port:
    ``--listen localhost`` would otherwise listen on a default port the
    user did not choose (and that another instance may hold). Returns
    ``text``; raises UsageError naming the option and an example."""
    t = text.strip()
    has_port = ("]:" in t) if t.startswith("[") else t.count(":") == 1
    if not has_port:
        host = t.strip("[]") or "127.0.0.1"
        example = f"[{host}]" if ":" in host else host
        raise UsageError(f"{option} {text!r} has no port; a listening address needs one: HOST:PORT,"
                         f" e.g. {example}:7410 (port 0: any free port)")
    return text


def check_free(address: tuple[str, int], option: str, directory: Path) -> None:
    """Before a daemon starts: can ``address`` be listened on? Binds (and
    closes) a socket the way trio's listeners do, so a port held by another
    process is said in one line naming the address, before anything runs.
    Port 0 always can. Raises AddressInUse."""
    import socket

    host, port = address
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"{option} {host}:{port}: cannot resolve {host!r} ({e.strerror})") from None
    shown_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    for family, type_, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, type_, proto)
        except OSError:
            continue  # (an address family this machine lacks: trio skips it too)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(sockaddr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise AddressInUse(
                        f"cannot listen on {shown_address} ({option}): the address is in use; another instance"
                        f" may be running (semq status --dir {directory}), or another program holds the port"
                    ) from None
                if e.errno == errno.EADDRNOTAVAIL:
                    raise AddressInUse(f"cannot listen on {shown_address} ({option}): {host} is not an address"
                                       " of this machine") from None
                raise AddressInUse(f"cannot listen on {shown_address} ({option}): {e.strerror}") from None


def _check_ops_addresses(args: argparse.Namespace, directory: Path, *, web: bool = True, units: int = 1) -> None:
    """The operational options of a daemon, before it starts: ``--metrics``
    and ``--web`` free (for a node of ``units`` units, the metrics port of
    each: the given one + K - 1), the durations in range."""
    from semq.ops.display import check_count
    from semq.ops.metrics import parse_metrics_address
    from semq.web import parse_web_address

    check_count(getattr(args, "drain_timeout", None), "--drain-timeout", 0.1, 86400.0)
    check_count(getattr(args, "stuck_after", None), "--stuck-after", 1.0, 86400.0 * 365)
    if getattr(args, "metrics", None):
        host, port = parse_metrics_address(args.metrics)
        for k in range(units if port else 1):
            check_free((host, port + k), "--metrics" if k == 0 else f"--metrics of unit {k + 1}", directory)
    if web and getattr(args, "web", None):
        require_port(args.web, "--web")
        check_free(parse_web_address(args.web), "--web", directory)


def _raise_fd_limit() -> None:
    """One descriptor per connected organization: lift the soft limit on open
    files to the hard one (often 1024 -> 1M), so a relay with thousands of
    nodes is not refused by a default meant for desktop programs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            logging.getLogger("semq.platform").warning(
                "cannot raise the open-file limit from %s to %s: %s", soft, hard, e)


def _direct_options(x: argparse.ArgumentParser, *, init: bool) -> None:
    default = " (default: the configuration's)" if not init else ""
    x.add_argument("--listen", metavar="HOST:PORT",
                   help="accept direct links from other nodes here (port 0: any free port); off unless given"
                        + default)
    x.add_argument("--announce", metavar="HOST:PORT[,HOST:PORT...]",
                   help="where other nodes reach this listener, if not the --listen address (NAT, a proxy)"
                        + default)
    x.add_argument("--direct", choices=["prefer", "never", "only"], default="prefer" if init else None,
                   help="documents to an organization that listens: over a direct link when one works (prefer,"
                        " the default), never, or only (else they wait)" + default)
    x.add_argument("--direct-from", metavar="ORG[,ORG...]",
                   help="only these organizations may look up this node's addresses and connect directly"
                        " (default: all)" if init else "organizations allowed to connect directly" + default)


def _direct_settings(args: argparse.Namespace, cfg: Config) -> Any:
    """The node's direct-link settings: the configuration, overridden by
    ``semq node run``'s options (checked like the keys)."""
    from semq.node.direct import DirectSettings

    if args.listen:
        require_port(args.listen, "--listen")
    values = {"direct_listen": args.listen if args.listen is not None else cfg.direct_listen,
              "direct_announce": args.announce if args.announce is not None else cfg.direct_announce,
              "direct": args.direct or cfg.direct,
              "direct_from": args.direct_from if args.direct_from is not None else cfg.direct_from}
    for key, flag in (("direct_listen", "--listen"), ("direct_announce", "--announce"), ("direct", "--direct"),
                      ("direct_from", "--direct-from")):
        check_option(key, values[key], flag)
    listen = None
    if cfg.units > 1:
        # A direct link joins two processes; a node of several units spreads
        # its documents over its units' platform connections instead.
        if values["direct_listen"]:
            raise UsageError(f"direct_listen = {values['direct_listen']!r}: a node of {cfg.units} units takes no"
                             " direct links (one unit: semq node init without --units)")
        return DirectSettings(policy="never")
    if values["direct_listen"]:
        if not cfg.security:
            raise UsageError(f"direct_listen = {values['direct_listen']!r} needs security: direct links are"
                             " mutual TLS between the nodes' certificates")
        host, port = parse_hostport(values["direct_listen"])
        listen = Address(host, port)
    return DirectSettings(
        policy=values["direct"], listen=listen,
        announce=[a.strip() for a in values["direct_announce"].split(",") if a.strip()],
        allowed=tuple(o.strip() for o in values["direct_from"].split(",") if o.strip()),
        retry=cfg.direct_retry, max_links=cfg.direct_max_links, max_links_per_org=cfg.direct_max_links_per_org,
        handshakes=cfg.direct_handshakes, fd_reserve=cfg.fd_reserve,
        max_buffer_per_org=cfg.max_buffer_mib_per_org << 20)


def cmd_node_run(args: argparse.Namespace) -> int:
    from semq.node.core import NodeCore
    from semq.node.daemon import NodeDaemon, NodeSettings

    cfg = _cfg(args, "node")
    inquiry_interval = _inquiry_interval(args, cfg)
    platform = args.platform or cfg.platform
    if args.unit is not None:
        cfg = cfg.for_unit(args.unit)
        from semq.ops.units import watch_supervisor

        watch_supervisor()  # (started by 'semq node run': stop when it is gone)
    elif cfg.units > 1:
        # One process per unit, each this command with --unit K (semq.ops.units).
        from semq.ops.units import supervise_units

        parse_platform_addresses(platform)  # a mistake is said once, here
        _direct_settings(args, cfg)
        missing = [k for k in range(1, cfg.units + 1) if not cfg.for_unit(k).store_path.exists()]
        if missing:
            raise UsageError(f"units = {cfg.units} in {cfg.directory / 'semq.toml'}, but unit {missing[0]} has no"
                             f" store ({cfg.for_unit(missing[0]).store_path}): the units are set by"
                             " 'semq node init --units N'")
        _check_ops_addresses(args, cfg.directory, units=cfg.units)  # said once, not by a unit restarted again
        return supervise_units(cfg.org, getattr(args, "argv", None) or ["node", "run", "--dir", str(cfg.directory)],
                               cfg.units, platform=platform, stop_timeout=(args.drain_timeout or 60.0) + 30)
    addresses = parse_platform_addresses(platform)  # checked by _inquiry_interval
    check_private_paths(cfg)  # before the keys (NodeSecurity checks those) and the store
    direct = _direct_settings(args, cfg)
    if cfg.units > 1 and args.metrics:
        # Each unit serves its own metrics: unit K on the given port + K - 1.
        host, _, port = args.metrics.rpartition(":")
        if port.isdigit() and int(port):
            args.metrics = f"{host}:{int(port) + cfg.unit - 1}"
    if direct.listen is not None:  # every address it will listen on is free, or one line says which is not
        check_free((direct.listen.host, direct.listen.port), "--listen" if args.listen else "direct_listen",
                   cfg.directory)
    _check_ops_addresses(args, cfg.directory, web=cfg.unit == 1)
    security = None
    if cfg.security:
        from semq.identity.security import NodeSecurity

        security = NodeSecurity(cfg.directory)  # refuses keys others can read
        if security.expiring(30):
            logging.getLogger("semq").warning("certificate expires in %.0f days", security.expires_in_days())
    core = NodeCore(cfg.store_path, cfg.org, events_dir=cfg.events_dir, synchronous=cfg.synchronous, check=True,
                    inquiry_interval=inquiry_interval, security=security, clock_skew=cfg.clock_skew, unit=cfg.unit)
    core.ctx.units = cfg.units
    core.receiver.large.max_size = cfg.max_document_mib << 20
    if cfg.unit != 1:  # unit 1 keeps the ordered channels: this unit's inquiries look there too
        core.ctx.first_unit_store = cfg.for_unit(1).store_path
    settings = NodeSettings(addresses=addresses, window=cfg.window, units=cfg.units,
                            ssl_context=security.ssl_context() if security else None,
                            direct=direct)
    from semq.ops.runtime import OpsRuntime, ops_options
    from semq.ops.usersock import user_socket_path

    # The user socket is served by unit 1 (its answers cover every unit's store).
    ops = OpsRuntime("node", cfg.directory, core, ops_options(args), admin_dir=cfg.unit_dir,
                     user_socket=user_socket_path(cfg) if cfg.unit == 1 else None, config=cfg,
                     history_days=cfg.history_days)
    try:
        return _run_daemon(
            cfg, lambda: NodeDaemon(core, settings),
            lambda d: {"role": "node", "org": cfg.org, "platform": str(d.address) if d.address else None,
                       "platforms": [str(a) for a in d.s.addresses], "connected": d.connected,
                       "direct": d.links.snapshot(),
                       "sessions": d.sessions, "in_flight": d.in_flight, **d.stats, **d.large.stats},
            lambda bound: f"node {cfg.org}{f' unit {cfg.unit}/{cfg.units}' if cfg.units > 1 else ''}"
                          f" running (platform {platform})" + (f"; direct links on {bound}" if bound else ""),
            ops,
        )
    finally:
        ops.close()
        core.close()


# ---------------------------------------------------------------- documents


def _client(args: argparse.Namespace) -> Any:
    from semq.node.api import NodeClient

    return NodeClient(_dir(args), config=_cfg(args, "node"))


def _unknown_target_warning(known: bool, org: str) -> None:
    """A target the node had not heard of is accepted (it may be new), but
    said, once the document is accepted: a mistyped organization id would
    otherwise only show as a NACK later. Shown with -q too: -q silences
    notes, not warnings."""
    if not known:
        print(f"warning: organization {org} is not known to this node yet; the platform decides whether it exists",
              file=sys.stderr)


def cmd_send(args: argparse.Namespace) -> int:
    from semq.node.limits import check_document_size

    files = args.files
    if args.ndjson or len(files) > 1 or (files[0] != "-" and Path(files[0]).is_dir()):
        from semq.cli.bulk import cmd_send_bulk

        return cmd_send_bulk(args)
    args.file = files[0]
    if args.type is None:
        raise UsageError("--type is required: the AppKey data type, e.g. ORDER")
    if args.key_from_name:
        if args.file == "-":
            raise UsageError("--key-from-name needs a file name, not - (standard input)")
        args.key = Path(args.file).stem
    token = _token(args)
    # A user's application with its token and the socket's path needs no
    # access to the node's data directory (the node checks the address).
    cfg = None if token is not None and args.socket else _cfg(args, "node")
    # (A missing configuration is said before waiting for stdin; what cannot
    # be sent is refused at once, exit 2.)
    org = _check_address(args.to, cfg.org) if cfg is not None else ""
    if args.file == "-":
        data = sys.stdin.buffer.read()
    else:
        p = Path(args.file)
        if not p.is_file():
            raise UsageError(f"no such file: {args.file}")
        size = p.stat().st_size
        if token is not None:  # by blocks through the user socket: the node says what it refuses
            return _send_as_user(args, cfg, p, token)
        if cfg is not None and token is None:
            from semq.node.limits import LargeDocumentTooLarge

            if size > cfg.max_document_mib << 20:
                raise UsageError(f"{args.file}: {LargeDocumentTooLarge(size, cfg.max_document_mib << 20)}")
            if size > cfg.large_from_mib << 20:
                return _send_large(args, cfg, org, p, size)
        check_document_size(size)  # before reading it
        data = p.read_bytes()
    check_document_size(len(data))
    if token is not None:
        return _send_as_user(args, cfg, data, token)
    assert cfg is not None
    with _client(args) as node:
        _check_colleague(node, args.to)
    if args.transactional and (args.ordered or args.user or org == cfg.org):
        raise UsageError("--transactional sends to an organization: not with --ordered, --user or a colleague")
    if args.transactional:
        # Seed 002: a half message, sent only after 'semq tx commit ID'.
        from semq.node.features.txn import Transactions

        with _client(args) as node:
            known = node.knows(args.to)
            half = Transactions(node).send(
                args.to, data, data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
                save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                reliable=not args.best_effort, encrypt=not args.no_encrypt)
        print(half.id)
        _unknown_target_warning(known, args.to)
        if not args.quiet:
            print(f"half message {half.id} stored, NOT sent: 'semq tx commit {half.id}' sends it,"
                  f" 'semq tx rollback {half.id}' discards it", file=sys.stderr)
        return 0
    with _client(args) as node:
        known = org == cfg.org or node.knows(org)
        lk0 = node.send(
            args.to, data, data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
            save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
            reliable=not args.best_effort, encrypt=not args.no_encrypt, clear_app_key=args.clear_app_key,
            ordered=args.ordered, user=args.user,
        )
        secure = node.config.security
    print(lk0)
    _unknown_target_warning(known, org)
    if not args.quiet:
        how = ("signed; NOT end-to-end private (--no-encrypt): the relay can read it" if secure and args.no_encrypt
               else "signed and end-to-end encrypted when sent" if secure
               else "NOT signed or encrypted (security is off for this node)")
        print(f"accepted {len(data)} bytes for {args.to} (SaveFwd={args.save_fwd}, Ack2={int(args.ack2)}); {how}",
              file=sys.stderr)
    return 0


def _send_large(args: argparse.Namespace, cfg: Any, org: str, path: Path, size: int) -> int:
    """``semq send`` of a file over large_from_mib: a large document, copied
    into the data directory (a progress bar on a terminal), then sent in
    chunks by the daemon (semq.node.large)."""
    from semq.cli.bulk import _progress

    if args.transactional:
        raise UsageError(f"--transactional: a file of {size} bytes is a large document (over {cfg.large_from_mib}"
                         " MiB), which cannot be a half message")
    with _client(args) as node:
        _check_colleague(node, args.to)
        known = org == cfg.org or node.knows(org)
        bar = _progress(size, "B")
        try:
            lk0 = node.send_file(
                args.to, path, progress=bar.update if bar is not None else None, data_type=args.type, domain=args.domain, subtype=args.subtype,
                key=args.key, save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority,
                expires_in=args.expires_in, reliable=not args.best_effort, encrypt=not args.no_encrypt,
                clear_app_key=args.clear_app_key, ordered=args.ordered, user=args.user)
        finally:
            if bar is not None:
                bar.close()
        secure = node.config.security
    print(lk0)
    _unknown_target_warning(known, org)
    if not args.quiet:
        how = ("chunks sealed for the target" if secure and not args.no_encrypt
               else "signed; NOT end-to-end private (--no-encrypt)" if secure
               else "NOT signed or encrypted (security is off for this node)")
        print(f"accepted {size} bytes for {args.to} as a large document ({-(-size // (1 << 20))} chunks; {how})",
              file=sys.stderr)
    return 0


def _check_address(to: str, me: str) -> str:
    """The organization of a ``--to`` address (ORG, ORG/USER or a
    colleague's name), checked; UsageError naming what is wrong."""
    from semq.node.envelope import EnvelopeError, parse_address
    from semq.node.limits import check_target

    try:
        org, user = parse_address(to, me)
    except EnvelopeError as e:
        raise UsageError(f"--to {to!r}: {e}") from None
    if not (org == me and user):
        check_target(org, me, "--to")
    return org


def _check_colleague(node: Any, to: str) -> None:
    """A ``--to`` that can only name a user of this node must name one."""
    from semq.node.envelope import parse_address
    from semq.settings.config import ORG_ID_ALLOWED

    org, user = parse_address(to, node.org)
    if org == node.org and user and user not in {u.name for u in node.users()}:
        raise UsageError(f"--to {json.dumps(to)} is not an organization id nor a user of this node"
                         f" ('semq user list'); allowed: {ORG_ID_ALLOWED}, ORG/USER, or a user of this node")


def _token(args: argparse.Namespace) -> str | None:
    """A user's token: ``--token-file``, else $SEMQ_TOKEN; None: act as the
    node's operator (who can open its store)."""
    path = getattr(args, "token_file", None)
    if path:
        try:
            return Path(path).read_text("utf-8").strip()
        except OSError as e:
            raise UsageError(f"cannot read the token file {path}: {e.strerror}") from None
    return os.environ.get("SEMQ_TOKEN") or None


def _user_client(args: argparse.Namespace, cfg: Config | None, token: str) -> Any:
    from semq.ops.usersock import UserClient, user_socket_path

    if not args.user:
        raise UsageError("a token (SEMQ_TOKEN or --token-file) needs --user NAME")
    if getattr(args, "socket", None):
        path: Path | None = Path(args.socket)
    else:
        path = user_socket_path(cfg if cfg is not None else _cfg(args, "node"))
    if path is None:
        raise UsageError("this node has no user socket (user_socket is empty in semq.toml); use --socket PATH")
    return UserClient(path, args.user, token)


def _send_as_user(args: argparse.Namespace, cfg: Config | None, data: bytes | Path, token: str) -> int:
    """``semq send`` with a user's token: through the node's user socket,
    a file (``data`` a path) read and uploaded block by block, up to the
    node's max_document_mib (a progress bar on a terminal)."""
    from semq.ops.usersock import UserSocketError

    if args.transactional:
        raise UsageError("--transactional is for the node's operator, not a user's token")
    options = dict(data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
                   save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                   encrypt=not args.no_encrypt, clear_app_key=args.clear_app_key, ordered=args.ordered)
    with _user_client(args, cfg, token) as me:
        try:
            if isinstance(data, Path):
                from semq.cli.bulk import _progress

                size = data.stat().st_size
                bar = _progress(size, "B") if size > me.block else None
                try:
                    lk0 = me.send_file(args.to, data, progress=bar.update if bar is not None else None, **options)
                finally:
                    if bar is not None:
                        bar.close()
            else:
                size = len(data)
                lk0 = me.send(args.to, data, **options)
        except UserSocketError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
    print(lk0)
    if not args.quiet:
        print(f"accepted {size} bytes from {args.user} for {args.to}", file=sys.stderr)
    return 0


def _user_options(x: argparse.ArgumentParser, what: str) -> None:
    x.add_argument("--user", metavar="NAME", help=f"{what}; with a token ($SEMQ_TOKEN or --token-file) this"
                                                   " goes through the node's user socket as that user")
    x.add_argument("--token-file", metavar="FILE", help="the user's token (else $SEMQ_TOKEN)")
    x.add_argument("--socket", metavar="PATH", help="the node's user socket (default: its user_socket setting)")


def cmd_user(args: argparse.Namespace) -> int:
    from semq.node.users import UserError

    with _client(args) as node:
        try:
            if args.action == "list":
                for u in node.users():
                    print(f"{u.name:<24} {u.os_user or '-':<16} added {format_age(u.created_ms)} ago")
                return 0
            if not args.name:
                raise UsageError(f"user {args.action} needs a user name")
            if args.action == "add":
                token = node.add_user(args.name, os_user=args.os_user)
                print(token)
                print(f"user {args.name} added to {node.org}; its token is above, shown this once (only its"
                      f" digest is kept): give it to {args.name}'s application (SEMQ_TOKEN)", file=sys.stderr)
                return 0
            node.remove_user(args.name)
            print(f"user {args.name} removed (its documents stay)", file=sys.stderr)
            return 0
        except UserError as e:
            raise UsageError(str(e)) from None


INBOX_LIMIT = MAX_LIMIT  # documents one 'semq inbox' lists at most (shown: semq.ops.display)


def format_time(ms: int | None) -> str:
    """A ms timestamp as this machine's local time, ``2026-12-05 10:47:55``."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _app_key_shown(ak: Any) -> str:
    if isinstance(ak, dict):
        parts = (ak["domain"], ak["data_type"], ak["subtype"], ak["key"])
    else:
        parts = (ak.domain, ak.data_type, ak.subtype, ak.key)
    return "/".join(shown(p) for p in parts)


def _doc_id(text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"inbox document id {text!r} is not a number (see 'semq inbox')")
    return int(text)


def _check_limit(limit: int) -> int:
    if not 1 <= limit <= INBOX_LIMIT:
        raise UsageError(f"--limit {limit} is outside 1..{INBOX_LIMIT}")
    return limit


def _item_json(i: Any) -> dict[str, Any]:
    """An inbox document for --json (times stay ms since the epoch)."""
    return {"id": i.id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id, "from_user": i.from_user,
            "to_user": i.to_user, "channel": i.channel, "gap": i.gap, "app_key": str(i.app_key),
            "size": i.size, "received_ms": i.received_ms, "consumed": i.consumed_ms is not None,
            **({"path": str(i.path)} if i.path is not None else {})}


INBOX_HEADER = f"{'ID':>6}  {'FROM':<20} {'LK0':<28} {'APPKEY':<32} {'SIZE':>7}  {'RECEIVED':<19}"


def _inbox_line(d: dict[str, Any]) -> str:
    """One document as 'semq inbox' lists it (``d``: the JSON form, or the
    user socket's)."""
    sender = shown(d["from"] + (f"/{d['from_user']}" if d.get("from_user") else ""))
    ak = d["app_key"]
    key = _app_key_shown(ak) if isinstance(ak, dict) else shown(ak)
    users = (f"  -> {shown(d['to_user'])}" if d.get("to_user") else "") + (
        f"  [{shown(d['channel'])}]" if d.get("channel") else "")
    return (f"{d['id']:>6}  {sender:<20} {d['lk0']:<28} {key:<32} {d['size']:>7}  {format_time(d['received_ms'])}"
            f" ({format_age(d['received_ms'])} ago){users}")


def _inbox_as_user(args: argparse.Namespace, token: str) -> int:
    with _user_client(args, None, token) as me:  # (one connection, closed at the end)
        return _inbox_as(me, args)


def _inbox_as(me: Any, args: argparse.Namespace) -> int:
    from semq.ops.usersock import UserSocketError

    try:
        if args.follow:
            return _follow(args, me.follow(args.after), lambda i: me.acknowledge([i["id"]]))
        if args.action == "list":
            items = me.inbox(unread=not args.all, limit=args.limit)
            if args.json:
                print(json.dumps(items))
                return 0
            print(INBOX_HEADER)
            for i in items:
                print(_inbox_line(i))
            print(f"{len(items)} document(s) for {args.user}", file=sys.stderr)
            return 0
        if not args.ids:
            raise UsageError(f"inbox {args.action} needs a document id or LK0")

        def resolve(text: str) -> int:
            if text.isdigit():
                return int(text)
            lk0 = _lk0_arg(text)
            for i in me.inbox(unread=False, limit=INBOX_LIMIT):
                if i["lk0"] == str(lk0):
                    return int(i["id"])
            raise _NotInInbox(f"document {text} is not in the inbox of {args.user}")

        if args.action == "ack":
            rc = 0
            ids = []
            for text in args.ids:
                try:
                    item_id = resolve(text)
                    me.get(item_id)
                except (_NotInInbox, UserSocketError):
                    print(f"error: document {text} is not in the inbox{_of(args.user)}", file=sys.stderr)
                    rc = 1
                    continue
                ids.append(item_id)
            if ids:
                print(f"acknowledged {me.acknowledge(ids)}")
            return rc
        try:
            item = me.get(resolve(args.ids[0]))
        except (_NotInInbox, UserSocketError):
            print(f"error: document {args.ids[0]} is not in the inbox{_of(args.user)}", file=sys.stderr)
            return 1
    except UserSocketError as e:
        raise UsageError(str(e)) from None
    if args.action == "save" and len(args.ids) < 2:
        raise UsageError("inbox save needs ID FILE")
    try:
        if args.action == "save":
            if item.get("large"):  # by blocks, never whole
                n = me.save(item["id"], args.ids[1])
            else:
                n = Path(args.ids[1]).write_bytes(item["data"])
            print(f"saved {n} bytes to {args.ids[1]}")
            return 0
        blocks = me.read(item["id"]) if item.get("large") else [item["data"]]  # (a large one by blocks)
        if not write_content(blocks, sys.stdout.buffer, text_only=_text_only(args)):
            return _not_text(item["id"], item["size"])
    except UserSocketError as e:
        raise UsageError(str(e)) from None
    sys.stdout.flush()
    return 0


def _text_only(args: argparse.Namespace) -> bool:
    """``inbox show`` to a terminal writes only text, unless ``--raw``."""
    return not args.raw and sys.stdout.isatty()


def _not_text(item_id: int, size: int) -> int:
    """The line ``inbox show`` says instead of writing binary content to a terminal."""
    sys.stdout.flush()
    print(f"error: document {item_id} ({size} bytes) is not text (binary, or control characters): not written to"
          f" the terminal; add --raw to write it anyway, or save it with 'semq inbox save {item_id} FILE'",
          file=sys.stderr)
    return 1


class _NotInInbox(Exception):
    pass


def _of(user: str | None) -> str:
    """`` of alice`` for a user's inbox, nothing for the organization's."""
    return f" of {user}" if user else ""


def _lk0_arg(text: str) -> Any:
    from semq.umxt_protocol import LK0

    try:
        return LK0.parse(text)
    except ProtocolError:
        raise UsageError(f"{text!r} is neither an inbox document id nor an LK0 (ORG/SEMQ_ID/DB_ID/RECORD_ID)") from None


def _follow(args: argparse.Namespace, items: Any, ack: Callable[[Any], Any]) -> int:
    """``--follow``: each document as it arrives, one line (or one JSON
    line), flushed; ``--ack`` acknowledges each once it is printed."""
    try:
        if not args.json:
            print(INBOX_HEADER, flush=True)
        for item in items:
            d = item if isinstance(item, dict) else _item_json(item)
            if args.json:
                d = {k: v for k, v in d.items() if k != "data"}
                print(json.dumps(d), flush=True)
            else:
                print(_inbox_line(d), flush=True)
            if args.ack:  # only once it was written
                ack(item)
    except BrokenPipeError:
        # The reader went away ('semq inbox --follow | head -1'): done, and
        # the document that did not get out is not acknowledged.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def cmd_inbox(args: argparse.Namespace) -> int:
    _check_limit(args.limit)
    if args.ack and not args.follow:
        raise UsageError("--ack goes with --follow (to acknowledge documents by id: semq inbox ack ID...)")
    if args.follow and args.action != "list":
        raise UsageError(f"--follow lists documents as they arrive; not with 'inbox {args.action}'")
    token = _token(args)
    if token is not None:
        return _inbox_as_user(args, token)
    with _client(args) as node:
        if args.follow:
            return _follow(args, node.follow(args.after, user=args.user),
                           lambda i: node.acknowledge([i.id], user=args.user))
        if args.action == "list":
            items = node.inbox(unread=not args.all, limit=args.limit, user=args.user)
            if args.json:
                print(json.dumps([_item_json(i) for i in items]))
                return 0
            print(INBOX_HEADER)
            for i in items:
                print(_inbox_line(_item_json(i)))
            print(f"{len(items)} document(s)", file=sys.stderr)
            return 0
        if not args.ids:
            raise UsageError(f"inbox {args.action} needs a document id or LK0")

        def get(text: str) -> Any:
            if text.isdigit():
                return node.get(int(text), user=args.user)
            return node.find(_lk0_arg(text), user=args.user)

        if args.action == "ack":
            rc = 0
            ids = []
            for text in args.ids:
                try:
                    item = get(text)
                except KeyError:
                    print(f"error: document {text} is not in the inbox{_of(args.user)}", file=sys.stderr)
                    rc = 1
                    continue
                if item.consumed_ms is not None:
                    print(f"document {text} was acknowledged already, {format_time(item.consumed_ms)}",
                          file=sys.stderr)
                    continue
                ids.append(item.id)
            if ids:
                print(f"acknowledged {node.acknowledge(ids, user=args.user)}")
            return rc
        try:
            item = get(args.ids[0])
        except KeyError:
            print(f"error: document {args.ids[0]} is not in the inbox{_of(args.user)}", file=sys.stderr)
            return 1
        if args.action == "save":
            if len(args.ids) < 2:
                raise UsageError("inbox save needs ID FILE")
            item.save(Path(args.ids[1]))
            print(f"saved {item.size} bytes to {args.ids[1]}")
            return 0
        who = "".join(f"\n{k}: {shown(v)}" for k, v in (("from_user", item.from_user), ("to_user", item.to_user),
                                                         ("channel", item.channel)) if v)
        acked = (f"\nacknowledged: {format_time(item.consumed_ms)}" if item.consumed_ms is not None
                 else "\nacknowledged: no")
        print(f"id: {item.id}\nlk0: {item.lk0}\nfrom: {shown(item.lk0.endpoint.node_id)}{who}"
              f"\napp_key: {_app_key_shown(item.app_key)}\nsave_fwd: {item.save_fwd}\npriority: {item.priority}"
              f"\nsize: {item.size}" + (f"\nfile: {item.path}" if item.path is not None else "")
              + f"\ncreated: {format_time(item.created_ms)}"
              f"\nreceived: {format_time(item.received_ms)} ({format_age(item.received_ms)} ago){acked}\n")
        sys.stdout.flush()
        with item.open() as f:  # (a large document by blocks, never whole in memory)
            if not write_content(iter(lambda: f.read(1 << 20), b""), sys.stdout.buffer, text_only=_text_only(args)):
                return _not_text(item.id, item.size)
        sys.stdout.flush()
        return 0


def cmd_messages(args: argparse.Namespace) -> int:
    if args.receipt:
        from semq.umxt_protocol import LK0

        text = args.receipt
        rid = int(text) if text.isdigit() else LK0.parse(text).record_id
        with _client(args) as node:
            try:
                info = node.receipt(rid)
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
        if args.json:
            print(json.dumps(info))
        else:
            for k, v in info.items():
                print(f"{k}: {when(v) if is_time_key(k) and isinstance(v, int) else shown(v)}")
        return 0 if info.get("verified") else 1
    from semq.identity.security import waiting_reason
    from semq.node.engine import SendState

    with _client(args) as node:
        rows = node.messages(limit=check_count(args.limit, "--limit", 1, MAX_LIMIT))

    def reason(r: Any) -> str:
        # A document to a known organization without a usable certificate
        # waits (SS_INIT) with the reason in its code.
        return waiting_reason(r.target, r.code) if r.state is SendState.SS_INIT and r.code else ""

    if args.json:
        print(json.dumps([{"lk0": str(r.lk0), "target": r.target, "state": r.state.name,
                           "app_key": str(r.app_key), "save_fwd": r.save_fwd, "ack2": r.ack2,
                           "attempts": r.attempts, "code": r.code, "created_ms": r.created_ms,
                           "reason": reason(r), "note": r.note, "from_user": r.from_user, "to_user": r.to_user,
                           "channel": r.channel} for r in rows]))
        return 0
    print(f"{'LK0':<28} {'TO':<10} {'STATE':<10} {'SF':>2} {'ACK2':>4} {'TRIES':>5} {'CODE':>4}  {'AGE':>5}  APPKEY")
    for r in rows:
        why = shown(reason(r) or (f"({r.note})" if r.note else ""))
        print(f"{r.lk0!s:<28} {r.target:<10} {r.state.name:<10} {r.save_fwd:>2} {int(r.ack2):>4} {r.attempts:>5}"
              f" {r.code:>4}  {format_age(r.created_ms):>5}  {shown(r.app_key)}" + (f"  {why}" if why else ""))
    print(f"{len(rows)} message(s) pending or failed (confirmed ones are cleaned up)", file=sys.stderr)
    return 0


def _daemon_status(cfg: Config) -> dict[str, Any] | None:
    try:
        st: dict[str, Any] = json.loads(cfg.status_path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if time.time() * 1000 - st.get("time_ms", 0) > 5000:
        return None
    return st


def _cert_status(cfg: Config) -> None:
    from semq.identity.crypto import CryptoError, load_certificate
    from semq.identity.security import NodeSecurity, SecurityError

    try:
        sec = NodeSecurity(cfg.directory)
    except (SecurityError, CryptoError, OSError, ValueError) as e:
        print(f"  security: PROBLEM: {e}")
        return
    days = sec.expires_in_days()
    warn = "  WARNING: renew it (semq node init a new key, enroll, import)" if days < 30 else ""
    print(f"  certificate: serial {sec.identity.certificate.serial:x}, expires in {days:.0f} days{warn}")
    print(f"  fingerprint: {sec.identity.certificate.fingerprint}  (others compare it with what they pinned:"
          f" semq node trust {cfg.org})")
    _ = load_certificate


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    from semq.ops.runtime import live_status

    live = live_status(cfg.unit_dir, timeout=2.0) or _daemon_status(cfg)
    if cfg.role == "node":
        from semq.node.api import NodeClient

        with NodeClient(cfg.directory, config=cfg) as client:
            counts = client.status()
        per_unit = counts.pop("units", None)
        data = {"role": "node", "org": cfg.org, "platform": cfg.platform, "daemon": live, **counts}
        if per_unit is not None:
            # A node of several units: each one's daemon and counts.
            data["units"] = [{"unit": k, "daemon": live_status(u.unit_dir, timeout=2.0) or _daemon_status(u), **c}
                             for k, c in enumerate(per_unit, 1) for u in [cfg.for_unit(k)]]
        if args.json:
            print(json.dumps(data))
            return 0

        def connection(live: dict[str, Any] | None) -> str:
            if live is None:
                return "not running"
            if live.get("connected"):
                return f"running, connected to {live.get('platform') or cfg.platform}"
            return f"running, NOT connected to {','.join(live.get('platforms') or [cfg.platform])}"

        if per_unit is None:
            print(f"node {cfg.org} ({cfg.directory})\n  daemon: {connection(live)}")
        else:
            print(f"node {cfg.org} ({cfg.directory}), {cfg.units} units")
            for u in data["units"]:
                st = u["outbox"]
                print(f"  unit {u['unit']}: {connection(u['daemon'])}; pending-send {sum(st.values())},"
                      f" pending-ack {u['pending_ack']}, inbox {u['inbox_unread']} unread")
        if live is not None:
            from semq.ops.cli import direct_lines

            for line in direct_lines(live.get("direct")):
                print(line)
        states = counts["outbox"]
        print("  pending-send: " + (", ".join(f"{k}={v}" for k, v in states.items()) or "empty"))
        print(f"  pending-ack: {counts['pending_ack']}   inbox: {counts['inbox_unread']} unread"
              f" / {counts['inbox_total']}   dedup: {counts['dedup']}")
        print(f"  oldest unconfirmed: {format_age(counts['oldest_unconfirmed_ms'])}")
        for w in counts.get("channels_waiting") or []:
            print(f"  ordered {shown(w['text'])}, since {format_age(w['since_ms'])} ago")
        if cfg.security:
            _cert_status(cfg)
        else:
            print("  security: OFF")
        return 0
    from semq.platform.core import PlatformCore

    pcore = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        counts = pcore.counts()
    finally:
        pcore.close()
    data = {"role": "platform", "id": cfg.platform_id, "daemon": live, **counts}
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"platform {cfg.platform_id} ({cfg.directory})")
    print("  daemon: " + ("not running" if live is None else f"listening on {live.get('listen')}"))
    if live is not None:
        print(f"  online: {', '.join(live.get('online', [])) or 'none'}")
    print(f"  known nodes: {', '.join(counts['known_nodes']) or 'none'}")
    stored = counts["stored"]
    print("  stored for: " + (", ".join(f"{t}={v['stored']} (oldest {format_age(v['oldest_ms'])})"
                                       for t, v in stored.items()) or "nothing"))
    print(f"  relayed acks/inquiries waiting: {counts['relayed_waiting']}")
    kept = counts.get("chunks_kept") or {}
    if kept.get("chunks"):
        print(f"  large documents' chunks kept: {kept['chunks']} ({format_size(kept['bytes'])})")
    for a in counts.get("direct", []):
        state = "" if a["live"] else " (expired)"
        who = f", for {', '.join(a['allowed'])} only" if a["allowed"] else ""
        print(f"  direct links: {a['node']} listens at {', '.join(a['addresses'])}{state}{who}")
    if "instances" in counts:
        print(f"  store: {counts['store']} (PostgreSQL); instances:")
        for i in counts["instances"] or [{"address": "none running", "holds": 0, "alive": False, "pid": "-"}]:
            state = "running" if i["alive"] else "gone (no heartbeat)"
            print(f"    {i['address']:<22} {state}, pid {i['pid']}, holds {i['holds']} organization(s)")
    return 0


# ---------------------------------------------------------------- parser

SEND_EPILOG: Final = """\
examples:
  semq send --to 56001 --type ORDER --domain trade --subtype PO --key S0001 order.xml
  echo 'INV-0042 310.00 EUR' | semq send --to 56001 --type INVOICE --key INV-0042 -
  semq send --to 56001 --type INVOICE --key-from-name out/*.xml > lk0s.txt
  semq send --to 56001 --type INVOICE --key-from-name out/
  printf '%s\\n' '{"data": "<order/>", "key": "S1"}' '{"file": "scan.pdf", "type": "SCAN"}' \\
    | semq send --to 56001 --type ORDER --ndjson -
  semq send --to 56001 --type CAD --key DWG-7 drawing.step     # 1.2 GB: a large document, in chunks

Several documents: a file that cannot be sent (too large, a bad key) is
refused before anything is sent; a bad NDJSON line stops the command with
nothing of its batch accepted, while the batches before it stay accepted."""


class _Parser(argparse.ArgumentParser):
    """The ``semq`` parser and, through ``add_subparsers``, every command's:
    a mistake in the command line is one ``error:`` line naming where the
    help is, like every other error, not the usage text and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    p = _Parser(prog="semq", description="SEMQ store-and-forward messaging", parents=[common])
    p.add_argument("--version", action="version", version=f"semq {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log more; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    plat = sub.add_parser("platform", help="the relay").add_subparsers(dest="sub", required=True)
    x = plat.add_parser("init", parents=[common], help="create the platform's config, store and CA")
    x.add_argument("--listen", default="127.0.0.1:7410", metavar="HOST:PORT",
                   help="where the relay listens (default 127.0.0.1:7410; port 0: any free port at each start)")
    x.add_argument("--id", default="platform", help="the platform's endpoint id (default platform)")
    x.add_argument("--name", action="append", default=[], help="extra DNS name / IP for the TLS certificate")
    x.add_argument("--no-security", action="store_true", help="plain TCP, no CA (testing only)")
    x.add_argument("--store", metavar="URL",
                   help="keep the store in PostgreSQL (postgresql://USER@HOST:PORT/DB) instead of the SQLite file"
                        " platform.sqlite: several 'semq platform run' on copies of this directory then form one"
                        " platform")
    x.set_defaults(func=cmd_platform_init)
    x = plat.add_parser(
        "migrate", parents=[common], help="move a stopped platform's SQLite store into PostgreSQL",
        description="Copy the stopped platform's store (platform.sqlite) into an empty PostgreSQL database in"
                    " one transaction, check the row counts, then name the database in semq.toml."
                    " platform.sqlite is kept as it was.")
    x.add_argument("--to", required=True, metavar="URL",
                   help="the PostgreSQL database to move the store into (postgresql://USER@HOST:PORT/DB): empty,"
                        " or made by 'semq platform init --store' and never run")
    x.set_defaults(func=cmd_platform_migrate)
    x = plat.add_parser("run", parents=[common], help="run the relay")
    x.add_argument("--listen", help="HOST:PORT (port 0 = any free port)")
    x.add_argument("--inquiry-interval", metavar="SECONDS", help="default: the configuration's (15)")
    add_run_options(x)
    x.set_defaults(func=cmd_platform_run)
    x = plat.add_parser("register", parents=[common], help="make organizations known (and grant them units)")
    x.add_argument("orgs", nargs="+", metavar="ORG", help="organization ids, e.g. 77000")
    x.add_argument("--units", type=int, metavar="N",
                   help="grant each N units (its node may run that many, each holding a connection);"
                        " default: 1 for an organization new here, a known one keeps its grant")
    x.set_defaults(func=cmd_platform_register)
    x = plat.add_parser("enroll", parents=[common], help="issue a certificate from a node's request")
    x.add_argument("csr", help="the node's node.csr.pem")
    x.add_argument("--org", help="organization the request must name")
    x.add_argument("--rollover", action="store_true",
                   help="the organization already holds a valid certificate: issue a second one (key rollover)")
    x.add_argument("--out", help="certificate file to write (default ORG.pem)")
    x.add_argument("--units", type=int, metavar="N",
                   help="grant the organization N units (default: 1, or what it was granted before)")
    x.set_defaults(func=cmd_platform_enroll)
    x = plat.add_parser("revoke", parents=[common], help="revoke an organization's certificates")
    x.add_argument("org", nargs="?", default="", help="the organization whose certificates to revoke")
    x.add_argument("--serial", help="revoke one certificate by serial (hex) instead")
    x.set_defaults(func=cmd_platform_revoke)
    x = plat.add_parser("status", parents=[common], help="stored messages, online nodes")
    x.add_argument("--json", action="store_true", help="as JSON, for programs")
    x.set_defaults(func=cmd_status)

    node = sub.add_parser("node", help="an organization's node").add_subparsers(dest="sub", required=True)
    x = node.add_parser("init", parents=[common], help="create the node's config and store")
    x.add_argument("--org", required=True, help="the organization id: a number, e.g. 10008")
    x.add_argument("--platform", default="127.0.0.1:7410", metavar="HOST:PORT[,HOST:PORT...]",
                   help="the platform's address; several: tried in turn, the next when one fails"
                        " (default 127.0.0.1:7410)")
    x.add_argument("--no-security", action="store_true", help="plain TCP, no keys (testing only)")
    x.add_argument("--enroll-from", metavar="PLATFORM_DIR",
                   help="platform directory on this machine: enroll at once (demo, tests, one-host setups)")
    _direct_options(x, init=True)
    x.add_argument("--units", type=int, default=1, metavar="N",
                   help="run the node as N processes (units), each with its own store, to spread its load over"
                        " cores (default 1; see docs/operations.md)")
    x.set_defaults(func=cmd_node_init)
    x = node.add_parser("rollover", parents=[common], help="new keys and certificate; the old one overlaps")
    x.add_argument("--enroll-from", metavar="PLATFORM_DIR", help="enroll at once with a platform on this host")
    x.add_argument("--no-endorse", action="store_true",
                   help="the current key is lost or revoked: no endorsement by it (nodes that pinned the current"
                        " certificate then need their operator's 'semq node trust')")
    x.set_defaults(func=cmd_node_rollover)
    x = node.add_parser("trust", parents=[common],
                        help="another organization's certificates this node trusts (pinned, refused); accept one")
    x.add_argument("org", help="the organization")
    x.add_argument("fingerprint", nargs="?", help="accept this certificate (SHA-256 fingerprint, or a unique"
                                                  " prefix of a refused one)")
    x.add_argument("--forget", metavar="FINGERPRINT", help="no longer trust this pinned certificate")
    x.add_argument("--json", action="store_true", help="what is pinned and refused, as JSON")
    x.set_defaults(func=cmd_node_trust)
    x = node.add_parser("import", parents=[common], help="install the certificate the platform issued")
    x.add_argument("--cert", required=True, metavar="FILE", help="the certificate the platform issued (ORG.pem)")
    x.add_argument("--ca", required=True, metavar="FILE", help="the platform's ca.pem")
    x.set_defaults(func=cmd_node_import)
    x = node.add_parser("run", parents=[common], help="run the node daemon")
    x.add_argument("--platform", metavar="HOST:PORT[,HOST:PORT...]",
                   help="the platform's address or addresses (default: the configuration's)")
    x.add_argument("--inquiry-interval", metavar="SECONDS", help="default: the configuration's (15)")
    _direct_options(x, init=False)
    x.add_argument("--unit", type=int, metavar="K",
                   help="run only unit K of a node of several units (semq node run starts each one this way)")
    add_run_options(x)
    x.set_defaults(func=cmd_node_run)

    x = sub.add_parser(
        "send", parents=[common], help="hand documents to the node",
        description=textwrap.fill(
            "Hand documents to the node: durable in its store when the command returns, whether or not its daemon"
            " runs. One FILE (or - for standard input) is one document; several FILEs, a DIRECTORY (its regular"
            " files, in name order) or --ndjson lines are accepted in transactions of --batch documents. Prints"
            " one LK0 per document on stdout, in input order. One FILE over large_from_mib (4 MiB) is sent as"
            " a large document: copied into the data directory, then streamed in sealed chunks and resumed"
            " after a cut or a restart (up to max_document_mib, 4096).", 79),
        epilog=SEND_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("--to", required=True,
                   help="target: an organization id (56001), a user of one (56001/alice), or a user of this"
                        " node (alice: the document never leaves the node)")
    x.add_argument("--type", help="AppKey data type, e.g. ORDER (required, except with --ndjson, whose lines"
                                  " may give their own \"type\")")
    x.add_argument("--ordered", metavar="CHANNEL",
                   help="ordered channel: documents of one channel to one target reach its application in the"
                        " order they were sent (a failed one is announced as a gap, then the channel moves on)")
    _user_options(x, "the user of this node the document is from")
    x.add_argument("--domain", default="", help="AppKey domain, e.g. trade")
    x.add_argument("--subtype", default="", help="AppKey subtype, e.g. PO")
    x.add_argument("--key", default="", help="AppKey key, e.g. S0001 (returned unchanged in acknowledgements)")
    x.add_argument("--key-from-name", action="store_true",
                   help="the AppKey key of each file is its name without the extension (INV-0042.xml: INV-0042)")
    x.add_argument("--save-fwd", type=int, default=3, choices=[1, 2, 3],
                   help="when the target is offline: 1 drop it (and tell the sender), 2 store it at the"
                        " platform, 3 must be delivered (default)")
    x.add_argument("--ack2", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the receiver for an end-to-end confirmation (default on)")
    x.add_argument("--priority", type=int, default=0, help="0..9, higher goes first (default 0)")
    x.add_argument("--expires-in", type=float, metavar="SECONDS", help="seconds until the document expires")
    x.add_argument("--best-effort", action="store_true", help="Reliable=0: never stored, acked or retried")
    x.add_argument("--clear-app-key", action="store_true",
                   help="send the AppKey readable in the header (by default it travels sealed inside the"
                        " document: the relay routes without it)")
    x.add_argument("--no-encrypt", action="store_true",
                   help="signed but NOT end-to-end private: the platform operator can read it")
    x.add_argument("--transactional", action="store_true",
                   help="store a half message; it is sent only after 'semq tx commit ID' (or never: 'semq tx rollback ID')")
    x.add_argument("--ndjson", action="store_true",
                   help="the input (a file, or - for standard input) holds one JSON object per line, one"
                        " document each: data (text), data_b64 or file, and optionally key, type, domain,"
                        " subtype, priority, to (over the options')")
    x.add_argument("--batch", type=int, default=BULK_BATCH, metavar="N",
                   help=f"documents per transaction when sending several (default {BULK_BATCH})")
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr (warnings still show)")
    x.add_argument("files", nargs="+", metavar="FILE",
                   help="file to send, - for standard input, several files, or a directory")
    x.set_defaults(func=cmd_send)

    x = sub.add_parser(
        "inbox", parents=[common], help="documents that arrived",
        description=textwrap.fill("List the documents that arrived (unacknowledged ones by default), show or save one, acknowledge"
                    " them, or follow the inbox: each document printed as it arrives, woken by the running node"
                    " daemon (no polling).", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  semq inbox --dir B                      # unacknowledged documents, oldest first\n"
               "  semq inbox --dir B show 17              # one document: its fields, then its contents\n"
               "  semq inbox --dir B show 10008/1/1/1795329835412001   # the same, by its LK0\n"
               "  semq inbox --dir B save 17 order.xml\n"
               "  semq inbox --dir B ack 17 18\n"
               "  semq inbox --dir B --follow --json      # one JSON line per document as it arrives\n"
               "  semq inbox --dir B --follow --ack       # print each new document, then acknowledge it")
    x.add_argument("action", nargs="?", default="list", choices=["list", "show", "save", "ack"],
                   help="list (default); show ID|LK0: its fields and contents; save ID|LK0 FILE: its contents to"
                        " FILE; ack ID|LK0...: the application has processed them")
    x.add_argument("ids", nargs="*", metavar="ID|LK0", help="inbox document ids (the ID column) or LK0s")
    x.add_argument("--all", action="store_true", help="include acknowledged documents (list)")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"list at most N documents, 1..{INBOX_LIMIT} (default 100)")
    x.add_argument("--json", action="store_true",
                   help="JSON for programs (times in ms since the epoch); with --follow one JSON object per line")
    x.add_argument("--follow", "-f", action="store_true",
                   help="print each unacknowledged document, then each new one as it arrives, until interrupted"
                        " (the node daemon wakes it; without a daemon it tries again every second)")
    x.add_argument("--after", type=int, default=0, metavar="ID",
                   help="--follow: start with the documents above inbox id ID (default 0: every unacknowledged one)")
    x.add_argument("--ack", action="store_true", help="--follow: acknowledge each document once it is printed")
    x.add_argument("--raw", action="store_true",
                   help="show: write the contents to a terminal even when they are not text (without it, binary"
                        " contents or control characters are refused on a terminal; a pipe or a file always gets"
                        " the bytes)")
    _user_options(x, "only this user's documents")
    x.set_defaults(func=cmd_inbox)

    from semq.cli.receive import register as register_receive

    register_receive(sub, common)

    x = sub.add_parser("user", parents=[common], help="users inside this organization and their tokens")
    x.add_argument("action", choices=["add", "list", "remove"],
                   help="add a user (prints its token once), list them, or remove one")
    x.add_argument("name", nargs="?", help="user name: a-z 0-9 . _ -, starting with a letter (e.g. alice)")
    x.add_argument("--os-user", default="", metavar="ACCOUNT",
                   help="add: also accept this operating-system account on the user socket, without a token")
    x.set_defaults(func=cmd_user)

    x = sub.add_parser("messages", parents=[common], help="pending-send rows with state and age")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"at most N rows (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--receipt", metavar="LK0", help="show the signed delivery receipt of a document, verified")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    x.set_defaults(func=cmd_messages)

    x = sub.add_parser("status", parents=[common], help="node or platform status")
    x.add_argument("--json", action="store_true", help="as JSON, for programs")
    x.set_defaults(func=cmd_status)

    register_ops(sub)
    register_watch(sub)  # semq watch: outbox and inbox folders (semq.node.folders)
    from semq.cli.features import register as register_features
    from semq.web.cli import register as register_console

    register_console(sub)  # semq console user add|list|remove (the web console's accounts)
    register_features(sub)  # tx, request/reply, dead letters, local queues (docs/seed-capabilities.md)

    try:
        from semq.analytics.cli import register as register_report
    except ImportError:  # analytics not installed / not yet present
        pass
    else:
        register_report(sub)
    from semq.cli.examples import add_examples
    from semq.cli.guide import register as register_guide

    register_guide(sub)  # semq help TOPIC, semq completion, semq config reference
    add_examples(p)  # every command's examples, in its --help
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (a node's units are started with these)
    logging.basicConfig(
        level=logging.INFO if args.verbose or (args.command in ("platform", "node") and getattr(args, "sub", "") == "run")
        else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        rc = run_command(args)
        sys.stdout.flush()  # here, where a closed pipe can be handled, not at exit
    except BrokenPipeError:
        # The reader went away (semq status | head -1): what it wanted it
        # has; end quietly, and point stdout at /dev/null so the flush at
        # exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    return rc


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command with the CLI's error contract: one ``error:``
    line, exit 2 for a user's mistake, 1 for a runtime failure; tracebacks
    only with ``--verbose``. (Also used by ``python -m semq.cli.features``.)"""
    try:
        rc: int = args.func(args)
        return rc
    except BrokenPipeError:
        raise  # the reader of stdout went away: main ends quietly
    except (UsageError, ConfigError, ValueError, AlreadyEnrolled) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (StoreError, ProtocolError, OSError, CryptoError, SecurityError) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ProtocolError) else 1
    except KeyboardInterrupt:
        return 130


_ = SaveFwd
