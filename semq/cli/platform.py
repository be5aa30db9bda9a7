"""``semq platform init|migrate|register|enroll|revoke|run``: the relay's
directory, its organizations and their certificates, its store moved to
PostgreSQL, and its daemon."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from semq.cli._common import UsageError, config_of, dir_of, require_port
from semq.cli.daemons import (
    check_free,
    check_ops_addresses,
    inquiry_interval_of,
    raise_fd_limit,
    run_daemon,
    serve_web_console,
)
from semq.cli.status import cmd_status
from semq.identity.crypto import CryptoError
from semq.ops.runtime import add_run_options
from semq.session.transport import parse_hostport
from semq.settings.config import (
    Config,
    check_option,
    check_org,
    check_private_paths,
    load_config,
    write_config,
)

__all__ = [
    "cmd_platform_enroll",
    "cmd_platform_init",
    "cmd_platform_migrate",
    "cmd_platform_register",
    "cmd_platform_revoke",
    "cmd_platform_run",
    "register",
    "register_orgs",
    "units_option",
]


def cmd_platform_init(args: argparse.Namespace) -> int:
    from semq.platform.core import PlatformCore

    d = dir_of(args)
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
    cfg = config_of(args, "platform")

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


def units_option(units: int | None) -> int | None:
    """``--units N`` of register / enroll, checked as the ``units`` key is."""
    if units is not None:
        check_option("units", str(units), "--units")
    return units


def register_orgs(pdir: Path, orgs: list[str], units: int | None = None) -> None:
    from semq.platform.core import PlatformCore

    cfg = load_config(pdir)
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.register(orgs, units)
        core.share_ca(pdir / "ca")  # (PostgreSQL store: every instance gets the new certificate)
    finally:
        core.close()


def cmd_platform_register(args: argparse.Namespace) -> int:
    from semq.platform.core import PlatformCore

    cfg = config_of(args, "platform")
    units = units_option(args.units)
    for org in args.orgs:  # all checked before any is registered
        check_org(org, "organization")
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.register(args.orgs, units)
    finally:
        core.close()
    print(f"registered {', '.join(args.orgs)}{f' (granted {units} units each)' if units else ''}")
    return 0


def cmd_platform_enroll(args: argparse.Namespace) -> int:
    from semq.identity.security import enroll

    cfg = config_of(args, "platform")
    org, path = enroll(cfg.directory, Path(args.csr), args.org, Path(args.out) if args.out else None,
                       rollover=args.rollover)
    register_orgs(cfg.directory, [org], units_option(args.units))
    print(f"issued a certificate for organization {org}: {path}\n"
          f"give it and {cfg.directory / 'ca' / 'ca.pem'} to the organization:"
          f" semq node import --cert {path.name} --ca ca.pem")
    return 0


def cmd_platform_revoke(args: argparse.Namespace) -> int:
    from semq.identity.security import revoke
    from semq.platform.core import PlatformCore

    cfg = config_of(args, "platform")
    if not args.serial and not args.org:
        raise UsageError("name the organization to revoke (or --serial HEX)")
    if args.org and not args.serial:
        check_org(args.org, "organization")
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
            core.revoke(args.org)
        core.share_ca(cfg.directory / "ca")
    finally:
        core.close()
    print(f"revoked {len(serials)} certificate(s) ({', '.join(f'{s:x}' for s in serials)});"
          " a running platform picks the new revocation list up within seconds")
    return 0


def cmd_platform_run(args: argparse.Namespace, daemon_class: Any = None) -> int:
    """``semq platform run``. ``daemon_class`` (default PlatformDaemon)
    lets a test tool run the same relay with its own daemon subclass
    (semq.testing.dishonest)."""
    from semq.platform.core import PlatformCore
    from semq.platform.daemon import PlatformDaemon, PlatformSettings

    daemon_class = daemon_class or PlatformDaemon

    cfg = config_of(args, "platform")
    if args.listen is not None:
        require_port(args.listen, "--listen")
    inquiry_interval = inquiry_interval_of(args, cfg)
    host, port = parse_hostport(args.listen or cfg.listen)
    check_private_paths(cfg)  # like the keys: a store others can read is refused
    check_free((host, port), "--listen" if args.listen else f"listen in {cfg.directory / 'semq.toml'}",
               cfg.directory)
    check_ops_addresses(args, cfg.directory)
    raise_fd_limit()
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

    ops = OpsRuntime("platform", cfg.directory, core, ops_options(args), history_days=cfg.history_days,
                     console=serve_web_console)
    try:
        return run_daemon(
            cfg, lambda: daemon_class(core, settings),
            lambda d: {"role": "platform", "listen": f"{host}:{d.port}",
                       "online": sorted(ep.node_id for ep in d.sessions), **d.stats},
            lambda port_: f"platform {cfg.platform_id} listening on {host}:{port_}",
            ops,
        )
    finally:
        ops.close()
        core.close()


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq platform init|migrate|run|register|enroll|revoke|status``."""
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
