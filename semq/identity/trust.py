"""Which certificates a node trusts for each other organization: pinned on
first use, like SSH's ``known_hosts`` (docs/security.md, "Pinning").

The platform's CA vouches for every certificate; a CA operator can issue a
second one for any organization. So the first certificates a node accepts
for an organization (from the platform's directory, verified against the CA)
are **pinned**, and later a certificate that is not pinned is refused — not
sealed to, not verified with — unless

* it is a **rollover**: it carries an endorsement (semq.identity.crypto.Endorsement)
  signed by the key of a pinned certificate of the same organization, which
  ``semq node rollover`` makes and the CA copies into the new certificate; or
* the node's operator accepts it: ``semq node trust ORG FINGERPRINT``.

The pins live in ``pins.json`` in the node's data directory: owner-only,
replaced atomically, changed under a lock file (``pins.lock``) so the
daemon and ``semq node trust`` (another process) never lose each other's
changes. The daemon reads it again when it changes. Format::

    {"version": 1,
     "orgs": {"56001": {
        "pinned":  [{"fingerprint": HEX, "serial": HEX, "sign_key": HEX, "first_seen": TIME, "how": TEXT}],
        "refused": [{"fingerprint": HEX, "serial": HEX, "sign_key": HEX, "first_seen": TIME, "why": TEXT}]}}}

``sign_key`` is the certificate's Ed25519 public key (raw, hex): what a
rollover endorsement of the next certificate is checked with, also after
the pinned certificate itself is gone from the directory. ``how`` says how
a certificate came to be pinned: ``first use``, ``rollover endorsed by
FINGERPRINT``, ``operator`` (``semq node trust``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric import ed25519

from semq.identity.crypto import NodeCertificate, format_time, write_private_file

__all__ = [
    "PINS_FILE",
    "Admission",
    "Pin",
    "PinStore",
    "Refusal",
    "TrustError",
]

PINS_FILE: Final = "pins.json"
_LOCK_FILE: Final = "pins.lock"
_VERSION: Final = 1
HOW_FIRST_USE: Final = "first use"
HOW_OPERATOR: Final = "operator"
_MIN_PREFIX: Final = 8  # hex digits of a fingerprint an operator may type


class TrustError(ValueError):
    """An operator's mistake with ``semq node trust`` (one line)."""


@dataclass
class Pin:
    fingerprint: str
    serial: str  # hex
    sign_key: str | None  # raw Ed25519 public key, hex; None until seen (pinned ahead by the operator)
    first_seen: str | None
    how: str


@dataclass
class Refusal:
    fingerprint: str
    serial: str
    sign_key: str
    first_seen: str
    why: str


@dataclass
class Admission:
    """What ``PinStore.admit`` decided for one organization's certificates."""

    accepted: list[NodeCertificate] = field(default_factory=list)
    pinned: list[tuple[NodeCertificate, str]] = field(default_factory=list)  # newly pinned, and how
    refused: list[tuple[NodeCertificate, str]] = field(default_factory=list)  # and why
    new_refusals: list[tuple[NodeCertificate, str]] = field(default_factory=list)  # refused for the first time
    pinned_before: list[str] = field(default_factory=list)  # fingerprints pinned before this answer


def _now_text(now: dt.datetime | None) -> str:
    return format_time(now or dt.datetime.now(dt.UTC))


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class PinStore:
    """The pins of one node (``pins.json`` in ``directory``). Thread-safe
    within a process; the lock file orders processes. Reading is a dict
    look-up; every change is written (atomically, fsynced) before it
    counts."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / PINS_FILE
        self._lock_path = Path(directory) / _LOCK_FILE
        self._mutex = threading.RLock()
        self._orgs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self._stamp: tuple[int, int, int] | None = None
        self.reload()

    # ------------------------------------------------------------ file

    def _read(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
            orgs = data["orgs"]
            if data.get("version") != _VERSION or not isinstance(orgs, dict):
                raise ValueError(f"version {data.get('version')!r}")
        except (ValueError, KeyError, TypeError) as e:
            # Refuse to guess: an unreadable pins file must not turn into
            # "nothing pinned" (which would pin whatever comes next).
            raise TrustError(f"pins file {self.path} is not readable ({e}); fix or remove it") from None
        return {str(o): {"pinned": list(v.get("pinned", [])), "refused": list(v.get("refused", []))}
                for o, v in orgs.items()}

    def reload(self) -> None:
        """Read the file again (the daemon, when ``changed()``)."""
        with self._mutex:
            stamp = _stamp(self.path)
            self._orgs = self._read()
            self._stamp = stamp

    def changed(self) -> bool:
        """Whether the file changed since we last read or wrote it (one stat)."""
        return _stamp(self.path) != self._stamp

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, list[dict[str, Any]]]]]:
        """Read the current file under the lock, let the caller change it,
        write it if it did (atomically, owner-only), keep it as ours."""
        with self._mutex:
            self._lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                orgs = self._read()
                before = json.dumps(orgs, sort_keys=True)
                yield orgs
                if json.dumps(orgs, sort_keys=True) != before:
                    text = json.dumps({"version": _VERSION, "orgs": orgs}, indent=1, sort_keys=True)
                    write_private_file(self.path, text.encode() + b"\n")
                self._orgs = orgs
                self._stamp = _stamp(self.path)
            finally:
                os.close(fd)  # (releases the lock)

    # ------------------------------------------------------------ reading

    def pins(self, org: str) -> list[Pin]:
        with self._mutex:
            return [Pin(**p) for p in self._orgs.get(org, {}).get("pinned", [])]

    def refusals(self, org: str) -> list[Refusal]:
        with self._mutex:
            return [Refusal(**r) for r in self._orgs.get(org, {}).get("refused", [])]

    def orgs(self) -> list[str]:
        with self._mutex:
            return sorted(self._orgs)

    def snapshot(self) -> dict[str, tuple[str, ...]]:
        """org -> pinned fingerprints (to see what an operator changed)."""
        with self._mutex:
            return {o: tuple(sorted(p["fingerprint"] for p in v.get("pinned", [])))
                    for o, v in self._orgs.items()}

    # ------------------------------------------------------------ deciding

    def admit(self, org: str, certs: Sequence[NodeCertificate], *, now: dt.datetime | None = None) -> Admission:
        """Which of ``certs`` (an organization's certificates from the
        platform's directory, each verified against the CA) this node uses:
        all of them on first use (pinned); later the pinned ones, and
        rollovers endorsed by a pinned key (pinned now). The others are
        refused and remembered (``new_refusals``: the ones to log)."""
        with self._mutex:
            entry = self._orgs.get(org)
            if entry and entry["pinned"]:
                known = {p["fingerprint"]: p for p in entry["pinned"]}
                if all(c.fingerprint in known and known[c.fingerprint]["sign_key"] for c in certs):
                    # The usual answer: nothing new, nothing to write.
                    return Admission(accepted=list(certs), pinned_before=sorted(known))
            with self._locked() as orgs:
                return self._admit(orgs, org, certs, _now_text(now))

    @staticmethod
    def _admit(orgs: dict[str, dict[str, list[dict[str, Any]]]], org: str, certs: Sequence[NodeCertificate],
               now: str) -> Admission:
        entry = orgs.setdefault(org, {"pinned": [], "refused": []})
        pinned = entry["pinned"]
        adm = Admission(pinned_before=sorted(p["fingerprint"] for p in pinned))
        if not pinned:
            for c in certs:
                pinned.append(asdict(Pin(c.fingerprint, f"{c.serial:x}", c.signing_key_raw.hex(), now,
                                         HOW_FIRST_USE)))
                adm.pinned.append((c, HOW_FIRST_USE))
            adm.accepted = list(certs)
            entry["refused"] = [r for r in entry["refused"] if r["fingerprint"] not in {c.fingerprint for c in certs}]
            return adm
        by_fp = {p["fingerprint"]: p for p in pinned}
        rest = []
        for c in certs:
            p = by_fp.get(c.fingerprint)
            if p is None:
                rest.append(c)
                continue
            if not p["sign_key"]:  # pinned ahead by the operator: now we know its key
                p["sign_key"] = c.signing_key_raw.hex()
                p["first_seen"] = p["first_seen"] or now
            adm.accepted.append(c)
        # Rollovers: a certificate endorsed by a pinned key is pinned too
        # (and may itself endorse the next one in the same answer).
        progress = True
        while progress and rest:
            progress = False
            for c in list(rest):
                if c.endorsement is None:
                    continue
                for p in list(by_fp.values()):
                    if not p["sign_key"]:
                        continue
                    endorser = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(p["sign_key"]))
                    if c.endorsed_by(endorser):
                        how = f"rollover endorsed by {p['fingerprint']}"
                        pin = asdict(Pin(c.fingerprint, f"{c.serial:x}", c.signing_key_raw.hex(), now, how))
                        pinned.append(pin)
                        by_fp[c.fingerprint] = pin
                        adm.pinned.append((c, how))
                        adm.accepted.append(c)
                        rest.remove(c)
                        progress = True
                        break
        refused = {r["fingerprint"]: r for r in entry["refused"]}
        for c in rest:
            if c.endorsement is not None:
                why = (f"its rollover endorsement is by key {c.endorsement.signer_key_id.hex()},"
                       " not a pinned one")
            else:
                why = "not pinned, and no rollover endorsement by a pinned key"
            adm.refused.append((c, why))
            if c.fingerprint not in refused:
                r = asdict(Refusal(c.fingerprint, f"{c.serial:x}", c.signing_key_raw.hex(), now, why))
                entry["refused"].append(r)
                refused[c.fingerprint] = r
                adm.new_refusals.append((c, why))
        accepted_fps = {c.fingerprint for c in adm.accepted}
        entry["refused"] = [r for r in entry["refused"] if r["fingerprint"] not in accepted_fps]
        return adm

    # ------------------------------------------------------------ the operator

    def trust(self, org: str, fingerprint: str, *, now: dt.datetime | None = None) -> Pin:
        """``semq node trust ORG FINGERPRINT``: pin a certificate the node
        refused (a unique prefix of at least 8 hex digits will do), or pin
        a full fingerprint ahead of its first use. Raises TrustError."""
        fp = fingerprint.strip().lower().replace(":", "")
        if len(fp) < _MIN_PREFIX or any(ch not in "0123456789abcdef" for ch in fp):
            raise TrustError(f"fingerprint {fingerprint!r} is not hexadecimal of at least {_MIN_PREFIX} digits"
                             " (SHA-256 of the certificate, as 'semq node trust ORG' lists it)")
        with self._locked() as orgs:
            entry = orgs.setdefault(org, {"pinned": [], "refused": []})
            for p in entry["pinned"]:
                if p["fingerprint"].startswith(fp):
                    return Pin(**p)
            matches = [r for r in entry["refused"] if r["fingerprint"].startswith(fp)]
            if len(matches) > 1:
                raise TrustError(f"fingerprint prefix {fp} matches {len(matches)} refused certificates of"
                                 f" {org}; give more digits")
            if matches:
                r = matches[0]
                entry["refused"].remove(r)
                pin = Pin(r["fingerprint"], r["serial"], r["sign_key"], r["first_seen"], HOW_OPERATOR)
            elif len(fp) == 64:
                pin = Pin(fp, "", None, None, HOW_OPERATOR + ", before first use")
            else:
                if not entry["pinned"] and not entry["refused"]:
                    del orgs[org]
                raise TrustError(f"no refused certificate of {org} has a fingerprint starting {fp};"
                                 " give all 64 digits to pin it before it is seen")
            entry["pinned"].append(asdict(pin))
            return pin

    def forget(self, org: str, fingerprint: str) -> Pin:
        """Unpin a certificate (the operator no longer trusts it). An
        organization left without pins is pinned again on its next use."""
        fp = fingerprint.strip().lower().replace(":", "")
        with self._locked() as orgs:
            entry = orgs.get(org)
            hits = [p for p in (entry or {}).get("pinned", []) if len(fp) >= _MIN_PREFIX
                    and p["fingerprint"].startswith(fp)]
            if len(hits) != 1:
                raise TrustError(f"{len(hits)} pinned certificates of {org} have a fingerprint starting {fp!r}")
            assert entry is not None
            entry["pinned"].remove(hits[0])
            if not entry["pinned"] and not entry["refused"]:
                del orgs[org]
            return Pin(**hits[0])

