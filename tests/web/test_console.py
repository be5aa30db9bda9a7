"""The web console of real daemons over HTTPS (tests/web/_console.py: a
platform and two nodes on 127.0.0.1, the console on node 10001 and on the
platform): access control, CSRF, escaping, audit, accounts; and the
console's pure parts (sessions, login throttle, accounts file)."""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from semq.cli import main as semq_main
from semq.web.sessions import LoginBusy, LoginSlots, LoginThrottle, Sessions
from semq.web.users import UserStore
from tests.web._console import HOSTILE_KEY, PASSWORDS, ConsoleCluster, client, csrf_of, login

pytestmark = pytest.mark.e2e

ACTIONS = ("resend", "requeue", "purge", "drain")


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleCluster]:
    w = ConsoleCluster(tmp_path_factory.mktemp("console"))
    try:
        w.start()
        yield w
    finally:
        w.stop()


def _audit(w: ConsoleCluster) -> list[dict[str, object]]:
    path = w.a_dir / "console" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- access


def test_unauthenticated_requests_are_refused(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        for path in ("/", "/search?text=INV", f"/doc?lk0={web.sent['inv0']}", "/audit", "/actions"):
            r = c.get(path)
            assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
        r = c.get("/api/dashboard")
        assert r.status_code == 401 and r.json() == {"error": "not logged in"}
        r = c.post("/action/resend", data={"lk0": web.sent["waiting"], "confirm": "1"})
        assert r.status_code == 303 and r.headers["location"] == "/login"
        # A made-up session cookie is no session.
        c.cookies.set("semq_session", "forged-token", domain="127.0.0.1")
        assert c.get("/api/dashboard").status_code == 401


def test_wrong_password_is_refused(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        r = login(c, "alice", "not-her-password")
        assert r.status_code == 401
        assert "Wrong user name or password" in r.text
        assert "semq_session" not in r.headers.get("set-cookie", "")
        assert c.get("/api/dashboard").status_code == 401
        r = login(c, "nobody-here", "whatever-password")
        assert r.status_code == 401 and "Wrong user name or password" in r.text


def test_repeated_failed_logins_lock_the_account_name(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        for _ in range(5):
            assert login(c, "bob", "guess-guess-guess").status_code == 401
        r = login(c, "bob")  # the right password, but the name is locked now
        assert r.status_code == 429 and "Too many failed logins" in r.text
        assert c.get("/api/dashboard").status_code == 401


def test_session_cookie_and_security_headers(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        r = login(c, "alice")
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert "semq_session=" in cookie
        for flag in ("HttpOnly", "Secure", "SameSite=strict"):
            assert flag.lower() in cookie.lower(), flag
        page = c.get("/")
        assert page.status_code == 200
        h = page.headers
        assert "default-src 'self'" in h["content-security-policy"]
        assert "script-src 'self'" in h["content-security-policy"]
        assert "unsafe-inline" not in h["content-security-policy"]
        assert h["x-frame-options"] == "DENY"
        assert h["x-content-type-options"] == "nosniff"
        assert "<script>" not in page.text.replace('<script src="/static/', "")  # no inline script
        dash = c.get("/api/dashboard").json()
        assert dash["role"] == "node" and dash["id"] == "10001"
        assert sum(dash["rates"]["queued"]) >= 5 and sum(dash["rates"]["confirmed"]) >= 4
        assert sum(dash["latency"]["count"]) >= 4 and any(v is not None for v in dash["latency"]["p99"])
        assert any(b["target"] == "30003" and b["open"] == 1 for b in dash["backlog"])
        whats = {x["what"] for x in dash["certificates"]}
        assert {"own", "CA", "web console"} <= whats


def test_viewer_gets_403_on_every_action(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        assert login(c, "victor").status_code == 303
        page = c.get(f"/doc?lk0={web.sent['waiting']}")
        assert page.status_code == 200
        assert 'action="/action/' not in page.text  # no action buttons for a viewer
        assert c.get("/actions").status_code == 403
        token = csrf_of(page.text)  # the viewer's own valid token
        for action in ACTIONS:
            for confirm in ("", "1"):
                r = c.post(f"/action/{action}", data={"csrf": token, "lk0": web.sent["waiting"], "confirm": confirm})
                assert r.status_code == 403, (action, confirm)
    refused = [e for e in _audit(web) if e["user"] == "victor"]
    assert {e["action"] for e in refused} == set(ACTIONS)
    assert all(e["refused"] and "viewer" in str(e["refused"]) for e in refused)
    assert web.state("waiting") == "ack_save"  # nothing was resent


def test_post_without_csrf_token_is_refused(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        assert login(c, "alice").status_code == 303
        for data in ({"lk0": web.sent["waiting"], "confirm": "1"},
                     {"lk0": web.sent["waiting"], "confirm": "1", "csrf": "not-the-token"}):
            r = c.post("/action/resend", data=data)
            assert r.status_code == 403
            assert "CSRF" in r.text
    entries = [e for e in _audit(web) if e["user"] == "alice" and e["refused"]]
    assert sum("CSRF" in str(e["refused"]) for e in entries) >= 2
    with client(web.node_url, web.node_ssl()) as c:  # the login form has its own token
        page = c.get("/login")
        r = c.post("/login", data={"user": "alice", "password": PASSWORDS["alice"], "csrf": ""})
        assert page.status_code == 200 and r.status_code == 403


def test_hostile_appkey_is_shown_as_text(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        assert login(c, "victor").status_code == 303
        for r in (c.get("/search", params={"text": "<script>", "go": "1"}),
                  c.get("/doc", params={"lk0": web.sent["hostile"]})):
            assert r.status_code == 200
            assert HOSTILE_KEY not in r.text
            assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in r.text
        assert web.sent["hostile"] in c.get("/search", params={"text": "<script>", "go": "1"}).text


def test_timeline_shows_each_step_and_the_verified_receipt(web: ConsoleCluster) -> None:
    with client(web.node_url, web.node_ssl()) as c:
        assert login(c, "victor").status_code == 303
        r = c.get("/doc", params={"lk0": web.sent["inv1"]})
        assert r.status_code == 200
        for step in ("queued", "sent", "ack_fwd", "ack2"):
            assert f'<td class="event">{step}</td>' in r.text, step
        assert 'id="receipt-verdict"' in r.text and "Verified: signed by 20002" in r.text
        search = c.get("/search", params={"text": "INV-", "go": "1"})
        assert all(web.sent[f"inv{i}"] in search.text for i in range(3))
        assert c.get("/search", params={"counterpart": "30003", "go": "1"}).text.count("/doc?lk0=") == 1


def test_operator_resend_dry_run_then_confirmed_and_audited(web: ConsoleCluster) -> None:
    lk0 = web.sent["waiting"]
    with client(web.node_url, web.node_ssl()) as c:
        assert login(c, "alice").status_code == 303
        token = csrf_of(c.get(f"/doc?lk0={lk0}").text)
        dry = c.post("/action/resend", data={"csrf": token, "lk0": lk0})
        assert dry.status_code == 200 and "1 of 1 selected document(s) would be resent" in dry.text
        assert web.state("waiting") == "ack_save"  # a dry run changes nothing
        done = c.post("/action/resend", data={"csrf": csrf_of(dry.text), "lk0": lk0, "confirm": "1"})
        assert done.status_code == 200 and "1 of 1 selected document(s) resent" in done.text
        audit_page = c.get("/audit")
        assert audit_page.status_code == 200 and "resend" in audit_page.text
    entries = [e for e in _audit(web) if e["user"] == "alice" and e["action"] == "resend" and not e["refused"]]
    assert [e["args"]["confirm"] for e in entries[-2:]] == [False, True]
    assert entries[-1]["args"]["lk0"] == [lk0] and entries[-1]["result"]["changed"] == 1
    assert os.stat(web.a_dir / "console" / "audit.jsonl").st_mode & 0o777 == 0o600


def test_platform_console_serves_the_platform_certificate(web: ConsoleCluster) -> None:
    with client(web.platform_url, web.platform_ssl()) as c:  # verified against the platform's CA
        assert login(c, "victor").status_code == 303
        dash = c.get("/api/dashboard").json()
        assert dash["role"] == "platform"
        assert {n["node"]: n["online"] for n in dash["nodes"]}.get("10001") is True
        assert any(b["target"] == "30003" and b["open"] >= 1 for b in dash["backlog"])
        r = c.get("/search", params={"counterpart": "30003", "go": "1"})
        assert web.sent["waiting"] in r.text
    assert not (web.root / "P" / "console" / "console.pem").exists()


def test_node_console_certificate_is_ecdsa_p256_with_a_private_key(web: ConsoleCluster) -> None:
    d = web.a_dir / "console"
    cert = x509.load_pem_x509_certificate((d / "console.pem").read_bytes())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert os.stat(d / "console.key.pem").st_mode & 0o777 == 0o600
    priv = serialization.load_pem_private_key((d / "console.key.pem").read_bytes(), None)
    assert isinstance(priv, ec.EllipticCurvePrivateKey)
    log = (web.root / "10001.log").read_text()
    assert cert.fingerprint(hashes.SHA256()).hex(":").upper() in log  # said once, for the operator to compare


def test_users_file_holds_no_plaintext_and_is_private(web: ConsoleCluster) -> None:
    path = web.a_dir / "console" / "users.json"
    text = path.read_text()
    assert os.stat(path).st_mode & 0o777 == 0o600
    for pw in PASSWORDS.values():
        assert pw not in text
    users = json.loads(text)["users"]
    assert users["alice"]["role"] == "operator" and len(users["alice"]["scrypt"]["hash"]) == 64


# ---------------------------------------------------------------- CLI, in-process


def test_cli_console_user_add_list_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "P"
    assert semq_main(["platform", "init", "--dir", str(d), "--no-security"]) == 0
    pw = tmp_path / "pw"
    pw.write_text("a-long-password\n")
    assert semq_main(["console", "user", "add", "carol", "--role", "viewer", "--password-file", str(pw),
                      "--dir", str(d)]) == 0
    capsys.readouterr()
    assert semq_main(["console", "user", "list", "--json", "--dir", str(d)]) == 0
    assert [(u["name"], u["role"]) for u in json.loads(capsys.readouterr().out)] == [("carol", "viewer")]
    assert UserStore(d).verify("carol", "a-long-password") is not None
    assert UserStore(d).verify("carol", "a-long-passwore") is None
    assert "a-long-password" not in (d / "console" / "users.json").read_text()
    # Mistakes: exit 2 with one line.
    assert semq_main(["console", "user", "add", "Bad Name", "--role", "viewer", "--password-file", str(pw),
                      "--dir", str(d)]) == 2
    short = tmp_path / "short"
    short.write_text("short\n")
    assert semq_main(["console", "user", "add", "dave", "--role", "operator", "--password-file", str(short),
                      "--dir", str(d)]) == 2
    assert "at least 10" in capsys.readouterr().err
    assert semq_main(["console", "user", "remove", "carol", "--dir", str(d)]) == 0
    assert semq_main(["console", "user", "remove", "carol", "--dir", str(d)]) == 2
    capsys.readouterr()
    assert semq_main(["console", "user", "list", "--json", "--dir", str(d)]) == 0
    assert json.loads(capsys.readouterr().out) == []


# ---------------------------------------------------------------- pure parts


def test_sessions_expire_when_idle_and_at_their_maximum_age() -> None:
    now = [1000.0]
    s = Sessions(clock=lambda: now[0], idle=60, max_age=300)
    a = s.create("alice", "operator")
    assert s.get(a.token) is a and len(a.token) >= 40 and a.csrf != a.token
    now[0] += 59
    assert s.get(a.token) is a  # used: idle time starts again
    now[0] += 61
    assert s.get(a.token) is None
    b = s.create("bob", "viewer")
    for _ in range(5):
        now[0] += 50
        assert s.get(b.token) is b  # active: 250 s after the login
    now[0] += 51
    assert s.get(b.token) is None  # past 300 s after the login, however active
    assert s.get("") is None and s.get(None) is None


def test_login_throttle_locks_a_name_and_an_address() -> None:
    now = [0.0]
    t = LoginThrottle(clock=lambda: now[0], max_failures=3, max_failures_address=5, window=60, lockout=120)
    for _ in range(3):
        assert t.locked("user:a", "ip:1") == 0
        t.failed(t.begin("user:a", "ip:1"))
    assert t.locked("user:a") == 120 and t.locked("ip:1") == 0
    t.failed(t.begin("user:b", "ip:1"))
    t.failed(t.begin("user:c", "ip:1"))
    assert t.locked("ip:1") == 120
    now[0] += 121
    assert t.locked("user:a", "ip:1") == 0


def test_login_throttle_counts_an_attempt_before_its_password_is_checked() -> None:
    """Attempts still being checked count: the fourth of three allowed is
    refused while none has been answered yet."""
    now = [0.0]
    t = LoginThrottle(clock=lambda: now[0], max_failures=3, max_failures_address=10, window=60, lockout=120)
    pending = []
    for _ in range(3):
        assert t.locked("user:a", "ip:1") == 0
        pending.append(t.begin("user:a", "ip:1"))
    assert t.locked("user:a", "ip:1") == 60  # until the first counted attempt leaves the window
    for a in pending:
        t.failed(a)
    assert t.locked("user:a", "ip:1") == 120  # the failures lock the name
    now[0] += 119
    assert t.locked("user:a") == 1  # the right password too waits for the lockout
    now[0] += 2
    assert t.locked("user:a", "ip:1") == 0
    assert t.locked("ip:1") == 0  # 3 of the address's 10


def test_login_throttle_success_forgives_its_attempt_and_the_names_failures() -> None:
    now = [0.0]
    t = LoginThrottle(clock=lambda: now[0], max_failures=3, max_failures_address=4, window=60, lockout=120)
    for _ in range(2):
        t.failed(t.begin("user:a", "ip:1"))
    ok = t.begin("user:a", "ip:1")  # the third, the last one allowed: the right password
    assert t.locked("user:a") > 0  # while it is checked, nothing else of the name is
    t.succeeded(ok)
    assert t.locked("user:a", "ip:1") == 0
    # The name starts again from nothing; the address keeps its two failures.
    for _ in range(2):
        t.failed(t.begin("user:a", "ip:1"))
    assert t.locked("user:a") == 0 and t.locked("ip:1") == 120


async def test_login_slots_one_in_flight_per_name_and_address(autojump_clock: trio.testing.MockClock) -> None:
    """A second login of the same name, or from the same address, waits for
    the first; one that waits longer than the bound is refused; logins of
    other names from other addresses do not wait; idle keys are forgotten."""
    slots = LoginSlots(per_key=1, wait=5.0)
    order: set[str] = set()

    async def login(name: str, ip: str, hold: float) -> None:
        try:
            async with slots.hold(f"user:{name}", f"ip:{ip}"):
                order.add(f"{name}@{ip} in {trio.current_time():.1f}")
                await trio.sleep(hold)
        except LoginBusy as e:
            order.add(f"{name}@{ip} busy {trio.current_time():.1f} {e.key}")

    async with trio.open_nursery() as n:
        n.start_soon(login, "a", "1", 3.0)
        await trio.sleep(0.1)
        n.start_soon(login, "a", "2", 3.0)  # same name: waits for the first (2.9 s)
        n.start_soon(login, "b", "1", 3.0)  # same address: waits for the first (2.9 s)
        n.start_soon(login, "c", "3", 3.0)  # nothing shared: at once
        await trio.sleep(0.1)
        n.start_soon(login, "a", "4", 1.0)  # third of the name: would wait 5.8 s, refused after 5
        n.start_soon(login, "d", "1", 1.0)  # third of the address: the same
        await trio.sleep(0.1)
        assert slots.in_flight("user:a") == 3 and slots.in_flight("ip:1") == 3
    assert order == {"a@1 in 0.0", "c@3 in 0.1", "a@2 in 3.0", "b@1 in 3.0", "a@4 busy 5.2 user:a",
                     "d@1 busy 5.2 ip:1"}
    assert slots.in_flight("user:a") == 0 and slots._slots == {}


# ---------------------------------------------------------------- a node of several units


def test_node_of_two_units_console_on_unit_1_acts_on_each_unit(tmp_path: Path) -> None:
    """Unit 1 serves the console; its search covers both units' documents;
    an action on a row of unit 2 goes to unit 2's admin socket; a filter
    selection goes to every unit; drain stops every unit."""
    from semq.node.api import NodeClient
    from tests._procs import Cluster, read_status, wait_until
    from tests.web._console import client as web_client

    c = Cluster(tmp_path)
    try:
        c.add_org("10001", units=2)
        c.add_org("20002")
        c.add_org("30003")  # never runs: documents to it wait at the platform
        pw = tmp_path / "pw"
        pw.write_text(PASSWORDS["alice"])
        assert semq_main(["console", "user", "add", "alice", "--role", "operator", "--password-file", str(pw),
                          "--dir", str(tmp_path / "10001")]) == 0
        c.start_platform()
        node = c.start_node("10001", "--web", "127.0.0.1:0")
        web_at = wait_until(lambda: read_status(tmp_path / "10001").get("web"), 20, "unit 1's console")
        assert read_status(tmp_path / "10001" / "unit-2").get("web") is None  # unit 2 serves none
        lk0s: list[str] = []
        with NodeClient(tmp_path / "10001") as api:
            while len({x.split("/")[1] for x in lk0s}) < 2 or len(lk0s) < 4:
                lk0s.append(str(api.send(to="30003", data=b"x", data_type="ORDER", key=f"U-{len(lk0s):03d}")))
                assert len(lk0s) < 50, "every send went to one unit"
        unit2 = next(x for x in lk0s if x.split("/")[1] == "2")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "10001" / "console" / "console.pem"))
        with web_client(f"https://{web_at}", ctx) as w:
            assert login(w, "alice").status_code == 303

            def found() -> int:
                return w.get("/search", params={"counterpart": "30003", "state": "ack_save", "go": "1"}
                             ).text.count("/doc?lk0=")

            wait_until(lambda: found() == len(lk0s), 60, "every unit's documents in the search")
            token = csrf_of(w.get("/actions").text)
            dry = w.post("/action/resend", data={"csrf": token, "lk0": unit2})
            assert "1 of 1 selected document(s) would be resent" in dry.text
            done = w.post("/action/resend", data={"csrf": token, "lk0": unit2, "confirm": "1"})
            assert "1 of 1 selected document(s) resent" in done.text
            last = json.loads((tmp_path / "10001" / "console" / "audit.jsonl").read_text().splitlines()[-1])
            assert [(u["unit"], u["changed"]) for u in last["result"]["units"]] == [(2, 1)]
            wait_until(lambda: found() == len(lk0s), 60, "the resent document stored again")
            dry = w.post("/action/resend", data={"csrf": token, "target": "30003"})
            assert f"{len(lk0s)} of {len(lk0s)} selected document(s) would be resent" in dry.text
            last = json.loads((tmp_path / "10001" / "console" / "audit.jsonl").read_text().splitlines()[-1])
            assert sorted(u["unit"] for u in last["result"]["units"]) == [1, 2]
            # The Outbox lists both units' rows, and finds one by its LK0 on its unit.
            listed = re.findall(r'<tr data-lk0="([^"]+)"', w.get("/outbox", params={"target": "30003"}).text)
            assert sorted(listed) == sorted(lk0s)
            assert re.findall(r'<tr data-lk0="([^"]+)"', w.get("/outbox", params={"text": unit2}).text) == [unit2]
            assert w.post("/action/drain", data={"csrf": token}).status_code == 200  # the dry run
            assert w.post("/action/drain", data={"csrf": token, "confirm": "1"}).status_code == 200
        assert node.p.wait(timeout=90) == 0  # every unit drained and stopped, then the supervisor
        c.procs.pop("10001")
    finally:
        c.stop_all()
