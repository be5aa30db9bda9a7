"""``semq node init|rollover|trust|import|run``: an organization's node,
its keys and certificates, the certificates it pins, its direct links and
its daemon (or its units' supervisor)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from semq.cli._common import UsageError, config_of, dir_of, require_port
from semq.cli.daemons import (
    check_free,
    check_ops_addresses,
    inquiry_interval_of,
    run_daemon,
    serve_web_console,
)
from semq.cli.platform import register_orgs
from semq.ops.runtime import add_run_options
from semq.session.transport import parse_hostport
from semq.settings.config import (
    PRIVATE_DIR_MODE,
    Address,
    Config,
    check_option,
    check_org,
    check_private_paths,
    data_dir,
    load_config,
    parse_platform_addresses,
    write_config,
)

__all__ = [
    "cmd_node_import",
    "cmd_node_init",
    "cmd_node_rollover",
    "cmd_node_run",
    "cmd_node_trust",
    "register",
]


def cmd_node_init(args: argparse.Namespace) -> int:
    """``semq node init``: all or nothing. A failure (a platform directory
    that is not one, an enrolment refused, a full disk) leaves no
    half-made node behind: a directory it created is removed, one that was
    there keeps only what it held before."""
    d = dir_of(args)
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
        register_orgs(pdir, [org], cfg.units if cfg.units > 1 else None)
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


def cmd_node_rollover(args: argparse.Namespace) -> int:
    """Certificate rollover: new keys and a request; the old identity keeps
    working (and keeps opening documents sealed to it) through the overlap."""
    from semq.identity.security import enroll, import_certificate, rollover_keys

    cfg = config_of(args, "node")
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

    cfg = config_of(args, "node")
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

    cfg = config_of(args, "node")
    ident = import_certificate(cfg.directory, Path(args.cert), Path(args.ca))
    if ident.org != cfg.org:
        raise UsageError(f"certificate is for organization {ident.org}, this node is {cfg.org}")
    print(f"installed: {ident.certificate.describe()}\nfingerprint: {ident.certificate.fingerprint}")
    return 0


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
    from semq.node.daemon import DirectSettings

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


def _edge_settings(cfg: Config) -> Any:
    """The edge's settings (semq.edge.daemon.service): unit 1 only."""
    if cfg.unit != 1:
        return None
    from semq.edge.daemon.service import EdgeSettings

    listen = None
    if cfg.edge_listen:
        check_free(parse_hostport(cfg.edge_listen), "edge_listen", cfg.directory)
        listen = parse_hostport(cfg.edge_listen)
    return EdgeSettings(directory=cfg.directory, our_name=cfg.org, listen=listen, tls=cfg.edge_tls)


def cmd_node_run(args: argparse.Namespace) -> int:
    from semq.node.core import NodeCore
    from semq.node.daemon import NodeDaemon, NodeSettings

    cfg = config_of(args, "node")
    inquiry_interval = inquiry_interval_of(args, cfg)
    platform = args.platform or cfg.platform
    if args.unit is not None:
        cfg = cfg.for_unit(args.unit)
        from semq.ops.units import watch_supervisor

        watch_supervisor()  # (started by 'semq node run': stop when it is gone)
    elif cfg.units > 1:
        return _supervise(args, cfg, platform)
    addresses = parse_platform_addresses(platform)  # checked by inquiry_interval_of
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
    check_ops_addresses(args, cfg.directory, web=cfg.unit == 1)
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
                            direct=direct, edge=_edge_settings(cfg))
    from semq.ops.runtime import OpsRuntime, ops_options
    from semq.ops.usersock import user_socket_path

    # The user socket is served by unit 1 (its answers cover every unit's store).
    ops = OpsRuntime("node", cfg.directory, core, ops_options(args), admin_dir=cfg.unit_dir,
                     user_socket=user_socket_path(cfg) if cfg.unit == 1 else None, config=cfg,
                     history_days=cfg.history_days, console=serve_web_console)
    try:
        return run_daemon(
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



def _supervise(args: argparse.Namespace, cfg: Config, platform: str) -> int:
    """``semq node run`` of a node of several units: one process per unit,
    each this command with ``--unit K``, supervised (semq.ops.units). What
    is wrong with the command line is said once, here, not by each unit
    restarted again."""
    from semq.ops.units import supervise_units

    parse_platform_addresses(platform)
    _direct_settings(args, cfg)
    missing = [k for k in range(1, cfg.units + 1) if not cfg.for_unit(k).store_path.exists()]
    if missing:
        raise UsageError(f"units = {cfg.units} in {cfg.directory / 'semq.toml'}, but unit {missing[0]} has no"
                         f" store ({cfg.for_unit(missing[0]).store_path}): the units are set by"
                         " 'semq node init --units N'")
    check_ops_addresses(args, cfg.directory, units=cfg.units)
    return supervise_units(cfg.org, getattr(args, "argv", None) or ["node", "run", "--dir", str(cfg.directory)],
                           cfg.units, platform=platform, stop_timeout=(args.drain_timeout or 60.0) + 30)

def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq node init|rollover|trust|import|run``."""
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
