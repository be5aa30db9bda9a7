"""Examples for ``semq COMMAND --help``, one table for every command, put
into each command's epilog once the parser is built (``add_examples``).

Kept here rather than beside each ``add_parser`` so the examples read as
one body of text (the same directories, organizations and files
throughout: a platform in P, organizations 10008 in A and 56001 in B) and
a test can walk the whole parser and find a command without one. A parser
that already has an epilog keeps it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

__all__ = ["EXAMPLES", "ExamplesFormatter", "add_examples", "is_leaf", "walk"]

EXAMPLES: dict[str, str] = {
    # -- semq itself (semq --help)
    "": "semq platform init --dir P --listen 127.0.0.1:7411\n"
        "semq node init --dir A --org 10008 --platform 127.0.0.1:7411 --enroll-from P\n"
        "semq status --dir A\n"
        "semq help codes              # what the outputs mean: states, codes, savefwd, lk0, ack2\n"
        "semq completion install      # Tab completion for bash or zsh",
    # -- the relay
    "platform init": "semq platform init --dir P --listen 127.0.0.1:7411\n"
                     "semq platform init --dir P --listen 0.0.0.0:7410 --name relay.example.com",
    "platform migrate": "semq platform migrate --dir P --to postgresql://semq@127.0.0.1:5432/semq",
    "platform run": "semq platform run --dir P\n"
                    "semq platform run --dir P --metrics 127.0.0.1:9410 --web 127.0.0.1:8443 --log-format json",
    "platform register": "semq platform register --dir P 77000 77001",
    "platform enroll": "semq platform enroll --dir P A/node.csr.pem --org 10008 --out 10008.pem\n"
                       "semq platform enroll --dir P --rollover A/next/node.csr.pem --org 10008",
    "platform revoke": "semq platform revoke --dir P 10008\n"
                       "semq platform revoke --dir P --serial e476719e5d9bf447aaad49c1efca4be3f019275",
    "platform status": "semq platform status --dir P\nsemq platform status --dir P --json",
    # -- a node
    "node init": "semq node init --dir A --org 10008 --platform 127.0.0.1:7411 --enroll-from P\n"
                 "semq node init --dir A --org 10008 --platform relay.example.com:7410   # then enroll, import",
    "node rollover": "semq node rollover --dir A --enroll-from P\nsemq node rollover --dir A",
    "node trust": "semq node trust --dir A 56001\n"
                  "semq node trust --dir A 56001 9c1d0e2b44a7c8f1\n"
                  "semq node trust --dir A 56001 --forget 9c1d0e2b44a7c8f1",
    "node import": "semq node import --dir A --cert 10008.pem --ca ca.pem",
    "node run": "semq node run --dir A\n"
                "semq node run --dir A --platform p1:7410,p2:7410 --metrics 127.0.0.1:9411",
    # -- documents
    "user": "semq user add alice --dir B\n"
            "semq user add erp --os-user erp --dir B\n"
            "semq user list --dir B\nsemq user remove alice --dir B",
    "messages": "semq messages --dir A\n"
                "semq messages --dir A --limit 20 --json\n"
                "semq messages --dir A --receipt 10008/1/1/1795329835412001",
    "status": "semq status --dir A\nsemq status --dir P --json",
    "partners": "semq partners --dir A\nsemq partners --dir A --json",
    "partner add": "semq partner add --dir A --as2 ACME --url https://as2.acme.example/as2 --cert acme.pem\n"
                   "semq partner add --dir A --as2 ACME --url http://127.0.0.1:4080/ --cert acme.pem"
                   " --our-id SEMQ-A --sign sha256 --encrypt aes256-cbc --mdn signed",
    "partner list": "semq partner list --dir A\nsemq partner list --dir A --json",
    "partner remove": "semq partner remove --dir A as2:ACME",
    "partner cert": "semq partner cert --dir A > our-edge-cert.pem",
    # -- operations
    "admin status": "semq admin status --dir A\nsemq admin status --dir A --unit 2 --json",
    "admin ping": "semq admin ping --dir A",
    "admin list": "semq admin list --dir A --state SS_FAILED\n"
                  "semq admin list --dir A --table inbound --limit 20\n"
                  "semq admin list --dir P --target 56001 --older-than 1h",
    "admin show": "semq admin show --dir A 10008/1/1/1795329835412001\nsemq admin show --dir P 42",
    "admin stuck": "semq admin stuck --dir A\nsemq admin stuck --dir A --older-than 10m --limit 20",
    "admin requeue": "semq admin requeue --dir A --state SS_FAILED --dry-run\n"
                     "semq admin requeue --dir A 1795329835412003",
    "admin resend": "semq admin resend --dir A --target 56001 --older-than 30m",
    "admin purge": "semq admin purge --dir A 1795329835412003\n"
                   "semq admin purge --dir P --kind relayed --older-than 7d --dry-run",
    "admin drain": "semq admin drain --dir A --reason upgrade --wait",
    "admin stop": "semq admin stop --dir A --wait 30",
    "admin reload": "semq admin reload --dir A      # the same as: systemctl reload semq-node-10008",
    "admin grafana-dashboard": "semq admin grafana-dashboard -o semq-dashboard.json",
    "service install": "semq service install --role node --dir /var/lib/semq/10008 --print\n"
                       "semq service install --role node --dir /var/lib/semq/10008\n"
                       "semq service install --role platform --dir /var/lib/semq/P --force",
    "backup": "semq backup --dir A --out a.tar.gz\nsemq backup --dir A --out a-store.sqlite",
    "compact": "semq compact --dir P",
    "restore": "semq restore --dir A a.tar.gz\nsemq restore --dir A a.tar.gz --force",
    "console user": "semq console user add maria --role operator --dir A\n"
                    "semq console user add viewer1 --role viewer --password-file pw.txt --dir A\n"
                    "semq console user list --dir A\nsemq console user remove maria --dir A",
    # -- transactions, request/reply, dead letters, queues
    "tx send": "semq tx send --dir A --to 56001 --type ORDER --key S0002 order.xml",
    "tx commit": "semq tx commit --dir A 7",
    "tx rollback": "semq tx rollback --dir A 7 --note 'order cancelled'",
    "tx list": "semq tx list --dir A\nsemq tx list --dir A --all --limit 20 --json",
    "tx show": "semq tx show --dir A 7\nsemq tx show --dir A 7 --data > order.xml",
    "tx check": "semq tx check --dir A",
    "tx watch": "semq tx watch --dir A --interval 5",
    "tx config": "semq tx config --dir A\n"
                 "semq tx config --dir A --checkback '/opt/erp/bin/order-state' --max-checks 10",
    "request": "semq request --dir A --to 56001 --type PRICE_INQUIRY --key Q1 query.xml --out answer.xml\n"
               "semq request --dir A --to 56001 --type PRICE_INQUIRY query.xml --no-wait",
    "reply": "semq reply --dir B --to-request 3 prices.xml",
    "requests": "semq requests --dir B\nsemq requests --dir B --all --json",
    "replies": "semq replies --dir A\nsemq replies --dir A --take 10008/1/1/1795329835412009 --out answer.xml",
    "dead": "semq dead --dir A\nsemq dead --dir A --limit 20 --json",
    "dead list": "semq dead list --dir A",
    "dead requeue": "semq dead requeue --dir A 10008/1/1/1795329835412003\n"
                    "semq dead requeue --dir A --all --expires-in 3600",
    "dead purge": "semq dead purge --dir A --all",
    "dead sweep": "semq dead sweep --dir A --max-attempts 50",
    "dead config": "semq dead config --dir A --max-attempts 50",
    "queue create": "semq queue create --dir A invoices",
    "queue destroy": "semq queue destroy --dir A invoices --force",
    "queue put": "semq queue put --dir A invoices inv-0042.xml\necho hello | semq queue put --dir A invoices -",
    "queue get": "semq queue get --dir A invoices --lease 60 --out item.xml\n"
                 "semq queue get --dir A invoices --wait 10 --json",
    "queue ack": "semq queue ack --dir A invoices 12",
    "queue release": "semq queue release --dir A invoices 12",
    "queue recover": "semq queue recover --dir A --all",
    "queue list": "semq queue list --dir A",
    # -- analytics
    "report latency": "semq report latency --logs A/events P/events B/events --format text\n"
                      "semq report latency --logs 'logs/*/events' --since 2026-12-01 --out report/",
    "report compact": "semq report compact --logs A/events P/events B/events --out compacted/",
    # -- this guide
    "help": "semq help\nsemq help codes\nsemq help states",
    "completion show": "semq completion show --shell bash\nsource <(semq completion show --shell bash)",
    "completion install": "semq completion install\nsemq completion install --shell zsh",
    "config reference": "semq config reference\nsemq config reference --format markdown",
}


class ExamplesFormatter(argparse.RawDescriptionHelpFormatter):
    """Text with line breaks (the examples) as written; a one-paragraph
    description wrapped to the terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself first) with its command path,
    e.g. ``("admin", "list")``."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Put each command's examples (``EXAMPLES``) into its epilog, shown as
    written (RawDescriptionHelpFormatter). A parser with an epilog of its
    own keeps it."""
    for path, p in walk(parser):
        text = EXAMPLES.get(" ".join(path))
        if text is None or p.epilog:
            continue
        p.epilog = "examples:\n" + "\n".join(f"  {line}" for line in text.splitlines())
        p.formatter_class = ExamplesFormatter
