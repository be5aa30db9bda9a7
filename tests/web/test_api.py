"""The node's HTTP API (semq.web.api) over HTTPS against real daemons
(tests/web/_api.py: a platform and two nodes, each serving it): send to a
partner and read it there, follow, track, a large document both ways,
user isolation, console sessions, hostile callers; and its pure parts
(the route table, the OpenAPI document, the limits' bookkeeping)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.ops.admin import admin_request
from semq.settings.bounds import (
    API_AUTH_FAILURES,
    API_BLOCK_S,
    API_IN_FLIGHT_PER_CALLER,
    API_MAX_JSON,
)
from semq.web.api import ENDPOINTS, PREFIX, ApiApp, ApiError, Slots, openapi
from semq.web.api.service import API_UPLOADS_DIR, parse_options
from tests._procs import wait_until
from tests.web._api import PASSWORD, A, ApiCluster, B, _token
from tests.web._console import csrf_of

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCluster]:
    w = ApiCluster(tmp_path_factory.mktemp("api"))
    try:
        w.start()
        yield w
    finally:
        w.stop()


def _error(r: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """``r`` is a JSON refusal with ``status`` whose error names ``words``."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and isinstance(body["error"], str) and body["error"]
    for w in words:
        assert w in body["error"], (w, body)
    return body


def _send(c: httpx.Client, to: str, data: bytes, **params: Any) -> dict[str, Any]:
    r = c.post(f"{PREFIX}/documents", params={"to": to, **params}, content=data)
    assert r.status_code == 201, r.text
    got: dict[str, Any] = r.json()
    return got


def _outbox(api: ApiCluster, org: str) -> int:
    with NodeClient(api.dir(org)) as node:
        return len(node.messages(limit=100_000))


# ---------------------------------------------------------------- the way an ERP uses it


def test_follow_receives_what_a_partner_sends_then_list_read_and_acknowledge(api: ApiCluster) -> None:
    with api.client(A, "alice") as alice, api.client(B, "bob") as bob:
        assert bob.get(f"{PREFIX}/whoami").json()["user"] == "bob"
        start = bob.get(f"{PREFIX}/inbox").json()
        answer: dict[str, Any] = {}

        def follow() -> None:
            answer["r"] = bob.get(f"{PREFIX}/inbox/follow", params={"after": 0, "timeout": 25})

        t = threading.Thread(target=follow)
        t.start()
        time.sleep(0.5)  # (the follow waits at the node before the document exists)
        sent = _send(alice, f"{B}/bob", b"<invoice id='INV-901'/>", data_type="INVOICE", key="INV-901")
        t.join(40)
        assert not t.is_alive()
        r = answer["r"]
        assert r.status_code == 200, r.text
        docs = r.json()["documents"]
        assert [d["lk0"] for d in docs] == [sent["lk0"]] and r.json()["next"] == str(docs[0]["id"])
        doc = docs[0]
        assert doc["from"] == A and doc["from_user"] == "alice" and doc["app_key"]["key"] == "INV-901"
        page = bob.get(f"{PREFIX}/inbox", params={"limit": 1}).json()
        assert page["total"] == start["total"] + 1 and len(page["documents"]) == 1
        assert bob.get(f"{PREFIX}/inbox/{doc['id']}").json()["size"] == len(b"<invoice id='INV-901'/>")
        content = bob.get(f"{PREFIX}/inbox/{doc['id']}/content")
        assert content.content == b"<invoice id='INV-901'/>"
        assert content.headers["x-semq-lk0"] == sent["lk0"]
        # Nothing new: a follow past it answers empty at its timeout.
        t0 = time.monotonic()
        empty = bob.get(f"{PREFIX}/inbox/follow", params={"after": r.json()["next"], "timeout": 1}).json()
        assert empty == {"documents": [], "next": str(doc["id"])} and time.monotonic() - t0 >= 0.9
        r = bob.post(f"{PREFIX}/inbox/ack", json={"ids": [doc["id"]]})
        assert r.json() == {"acknowledged": 1, "asked": 1}
        assert bob.get(f"{PREFIX}/inbox").json()["total"] == start["total"]
        assert doc["id"] in [d["id"] for d in bob.get(f"{PREFIX}/inbox", params={"all": 1}).json()["documents"]]

        # Track: the sender sees its document confirmed end to end, the receiver its arrival.
        def state() -> str | None:
            r = alice.get(f"{PREFIX}/track", params={"lk0": sent["lk0"]})
            rows = r.json().get("rows", []) if r.status_code == 200 else []
            return next((x["state"] for x in rows if x["role"] == "origin"), None)

        wait_until(lambda: state() == "ack2", 60, "the document confirmed in the sender's history")
        rows = wait_until(lambda: bob.get(f"{PREFIX}/track", params={"lk0": sent["lk0"]}).json().get("rows"), 60,
                          "the document in the receiver's history")
        assert {x["role"] for x in rows} == {"receiver"}


def test_paging_counts_the_total_and_walks_every_document(api: ApiCluster) -> None:
    with api.client(A, "anna") as anna, api.client(B, "bea") as bea:
        before = bea.get(f"{PREFIX}/inbox").json()["total"]
        lk0s = {_send(anna, f"{B}/bea", f"doc {i}".encode(), key=f"P-{i}")["lk0"] for i in range(5)}
        wait_until(lambda: bea.get(f"{PREFIX}/inbox").json()["total"] == before + 5, 60, "five documents at bea")
        seen, after = [], 0
        while True:
            page = bea.get(f"{PREFIX}/inbox", params={"after": after, "limit": 2}).json()
            assert page["total"] == before + 5 and len(page["documents"]) <= 2
            seen += [d["lk0"] for d in page["documents"]]
            if page["next"] is None:
                break
            after = page["next"]
        assert lk0s <= set(seen) and len(seen) == before + 5
        # With content=1 a page carries the contents (base64), as the user socket's inbox does.
        page = bea.get(f"{PREFIX}/inbox", params={"content": 1, "limit": 1000}).json()["documents"]
        got = {d["app_key"]["key"]: base64.b64decode(d["content_base64"]) for d in page if d["lk0"] in lk0s}
        assert got == {f"P-{i}": f"doc {i}".encode() for i in range(5)}
        assert "content_base64" not in bea.get(f"{PREFIX}/inbox").json()["documents"][0]


def test_a_large_document_is_streamed_both_ways(api: ApiCluster) -> None:
    data = os.urandom(5 * (1 << 20) + 12345)  # over one block: staged on disk, then a large document
    digest = hashlib.sha256(data).hexdigest()
    with api.client(A, "alice") as alice, api.client(B, "bob") as bob:

        def body() -> Iterator[bytes]:  # (a generator: httpx sends it as it comes)
            for i in range(0, len(data), 256 * 1024):
                yield data[i:i + 256 * 1024]

        r = alice.post(f"{PREFIX}/documents", params={"to": f"{B}/bob", "key": "BIG-1", "sha256": digest},
                       content=body(), headers={"content-length": str(len(data))})
        assert r.status_code == 201, r.text
        sent = r.json()
        assert sent["size"] == len(data) and sent["sha256"] == digest
        assert os.listdir(api.dir(A) / API_UPLOADS_DIR) == []  # the staged file was moved into the store
        doc = wait_until(lambda: next((d for d in bob.get(f"{PREFIX}/inbox", params={"limit": 1000}).json()
                                       ["documents"] if d["lk0"] == sent["lk0"]), None), 90,
                         "the large document at bob")
        assert doc["large"] and doc["size"] == len(data)
        h, n = hashlib.sha256(), 0
        with bob.stream("GET", f"{PREFIX}/inbox/{doc['id']}/content") as s:
            assert s.status_code == 200 and int(s.headers["content-length"]) == len(data)
            for chunk in s.iter_bytes():
                h.update(chunk)
                n += len(chunk)
        assert n == len(data) and h.hexdigest() == digest


def test_a_user_sees_only_its_own_documents(api: ApiCluster) -> None:
    with api.client(A, "alice") as alice, api.client(B, "bob") as bob, api.client(B, "bea") as bea:
        sent = _send(alice, f"{B}/bob", b"for bob only", key="PRIVATE-1")
        doc = wait_until(lambda: next((d for d in bob.get(f"{PREFIX}/inbox").json()["documents"]
                                       if d["lk0"] == sent["lk0"]), None), 60, "bob's document")
        _error(bea.get(f"{PREFIX}/inbox/{doc['id']}"), 404, str(doc["id"]), "bea")
        _error(bea.get(f"{PREFIX}/inbox/{doc['id']}/content"), 404)
        assert sent["lk0"] not in [d["lk0"] for d in bea.get(f"{PREFIX}/inbox", params={"all": 1}).json()
                                   ["documents"]]
        assert bea.post(f"{PREFIX}/inbox/ack", json={"ids": [doc["id"]]}).json() == {"acknowledged": 0, "asked": 1}
        assert not bob.get(f"{PREFIX}/inbox/{doc['id']}").json()["acknowledged"]
        wait_until(lambda: bob.get(f"{PREFIX}/track", params={"lk0": sent["lk0"]}).status_code == 200, 60,
                   "bob's document in the history")
        _error(bea.get(f"{PREFIX}/track", params={"lk0": sent["lk0"]}), 404, sent["lk0"])
        # A user's follow does not wake for another user's document.
        r = bea.get(f"{PREFIX}/inbox/follow", params={"after": doc["id"] - 1, "timeout": 0})
        assert sent["lk0"] not in [d["lk0"] for d in r.json()["documents"]]


# ---------------------------------------------------------------- hostile callers


def test_hostile_tokens_get_a_json_error_and_nothing_is_stored(api: ApiCluster) -> None:
    before = _outbox(api, A)
    url = f"{PREFIX}/documents"
    with api.client(A) as anon:
        _error(anon.post(url, params={"to": B}, content=b"x"), 401, "no token")
        assert anon.get(f"{PREFIX}/inbox").headers["www-authenticate"].startswith("Bearer")
        _error(anon.post(url, params={"to": B}, content=b"x", headers={"authorization": "Bearer semq_wrong"}),
               401, "not the token")
        _error(anon.get(f"{PREFIX}/inbox", headers={"authorization": "Token abc"}), 401, "Bearer or Basic")
        _error(anon.get(f"{PREFIX}/inbox", headers={"authorization": "Basic !!!"}), 401, "base64")
        # alice's name with anna's token, and a user of B's token at A.
        basic = base64.b64encode(f"alice:{api.tokens[f'{A}/anna']}".encode()).decode()
        _error(anon.get(f"{PREFIX}/inbox", headers={"authorization": f"Basic {basic}"}), 401, "alice")
        _error(anon.get(f"{PREFIX}/inbox", headers={"authorization": f"Bearer {api.tokens[f'{B}/bob']}"}), 401)
        _error(anon.get(f"{PREFIX}/inbox", headers={"authorization": "Bearer " + "x" * 5000}), 401, "5007")
    good = base64.b64encode(f"alice:{api.tokens[f'{A}/alice']}".encode()).decode()
    with api.client(A, token=None, headers={"authorization": f"Basic {good}"}) as alice_basic:
        assert alice_basic.get(f"{PREFIX}/whoami").json()["user"] == "alice"
    with api.client(A, "alice") as alice:
        _error(alice.post(url, content=b"x"), 400, "to=")
        _error(alice.post(url, params={"to": B, "priority": "high"}, content=b"x"), 400, "priority", "high")
        _error(alice.post(url, params={"to": B, "expires_in": "-5"}, content=b"x"), 400, "expires_in")
        _error(alice.post(url, params={"to": "not-an-org!"}, content=b"x"), 400)
        _error(alice.post(url, params={"to": B, "sha256": "00" * 32}, content=b"x"), 400, "SHA-256")
        # A body over one block refused before it is read: read and dropped, so the answer arrives.
        _error(alice.post(url, params={"to": "nobody"}, content=b"y" * (3 << 20)), 400, "nobody")
        big = alice.post(f"{PREFIX}/inbox/ack", content=b"{" + b" " * API_MAX_JSON + b"}",
                         headers={"content-type": "application/json"})
        assert _error(big, 413, str(API_MAX_JSON))["limit"] == API_MAX_JSON
        _error(alice.post(f"{PREFIX}/inbox/ack", json={"ids": "all"}), 400, "ids")
        _error(alice.get(f"{PREFIX}/inbox", params={"limit": 0}), 400, "limit 0", "1..1000")
        _error(alice.get(f"{PREFIX}/inbox/follow", params={"timeout": 99}), 400, "timeout 99", "0..30")
        _error(alice.get(f"{PREFIX}/inbox/follow", params={"after": "1,2"}), 400, "1 units")
        _error(alice.get(f"{PREFIX}/inbox/follow", params={"after": "-3"}), 400, "-3")
        _error(alice.get(f"{PREFIX}/inbox/abc"), 400, "abc")
        _error(alice.get(f"{PREFIX}/inbox/{2**70}"), 404, str(2**70))
        _error(alice.get(f"{PREFIX}/inbox/{2**70}/content"), 404)
        _error(alice.post(f"{PREFIX}/inbox/ack", json={"ids": [2**70, -1]}), 400, "1..")
        _error(alice.get(f"{PREFIX}/track", params={"lk0": "nope"}), 400, "ORG/UNIT/DB/RECORD")
    # A body declared over the node's limit is refused on its head: not a byte of it is read.
    ctx = api.ssl(A)
    host, port = api.urls[A].removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as s:
        s.sendall((f"POST {PREFIX}/documents?to={B} HTTP/1.1\r\nhost: {host}\r\n"
                   f"authorization: Bearer {api.tokens[f'{A}/alice']}\r\ncontent-length: {5 << 40}\r\n\r\n").encode())
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            more = s.recv(65536)
            if not more:
                break
            got += more
    head = got.decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head
    body = json.loads(head.split("\r\n\r\n", 1)[1])
    assert body["value"] == 5 << 40 and body["limit"] == 4096 << 20
    with api.client(A, "alice") as alice:  # a chunked body (no Content-Length) is refused too
        _error(alice.post(url, params={"to": B}, content=iter([b"abc"])), 411, "Content-Length")
    assert _outbox(api, A) == before
    assert os.listdir(api.dir(A) / API_UPLOADS_DIR) == []


def test_a_user_added_while_the_node_runs_is_let_in_and_refused_once_removed(api: ApiCluster) -> None:
    token = _token(api.dir(A), "temp")
    with api.client(A, token=token) as temp:
        assert temp.get(f"{PREFIX}/whoami").json()["user"] == "temp"
        assert semq_main(["user", "remove", "temp", "--dir", str(api.dir(A))]) == 0
        _error(temp.get(f"{PREFIX}/inbox"), 401, "not the token")


def test_too_many_requests_in_flight_of_one_user_get_429(api: ApiCluster) -> None:
    answers: list[int] = []

    def follow() -> None:
        with api.client(A, "anna") as c:
            answers.append(c.get(f"{PREFIX}/inbox/follow", params={"after": 2**40, "timeout": 6}).status_code)

    threads = [threading.Thread(target=follow) for _ in range(API_IN_FLIGHT_PER_CALLER)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # (the follows are waiting at the node)
    with api.client(A, "anna") as anna, api.client(A, "alice") as alice:
        body = _error(anna.get(f"{PREFIX}/inbox"), 429, "anna", str(API_IN_FLIGHT_PER_CALLER))
        assert body["limit"] == API_IN_FLIGHT_PER_CALLER
        assert alice.get(f"{PREFIX}/inbox").status_code == 200  # another user is not held up
    for t in threads:
        t.join(30)
    assert answers == [200] * API_IN_FLIGHT_PER_CALLER


# ---------------------------------------------------------------- console sessions


def _login(c: httpx.Client, user: str) -> str:
    page = c.get("/login")
    r = c.post("/login", data={"csrf": csrf_of(page.text), "user": user, "password": PASSWORD, "next": "/"})
    assert r.status_code == 303, r.text
    return csrf_of(c.get("/").text)


def test_a_console_session_is_the_operator_and_needs_its_csrf_token_to_act(api: ApiCluster) -> None:
    with api.client(A, "alice") as alice:
        _send(alice, f"{A}/anna", b"to a colleague", key="COLL-1")  # (stays on this node)
    with api.client(A) as olga, api.client(A) as vera:
        csrf = _login(olga, "olga")
        page = wait_until(lambda: (p := olga.get(f"{PREFIX}/inbox").json())["total"] and p, 30, "anna's document")
        doc = next(d for d in page["documents"] if d["app_key"]["key"] == "COLL-1")
        assert olga.get(f"{PREFIX}/inbox/{doc['id']}/content").content == b"to a colleague"
        _error(olga.post(f"{PREFIX}/inbox/ack", json={"ids": [doc["id"]]}), 403, "CSRF")
        _error(olga.post(f"{PREFIX}/inbox/ack", json={"ids": [doc["id"]]}, headers={"x-csrf-token": "forged"}), 403)
        _login(vera, "vera")
        assert vera.get(f"{PREFIX}/inbox/{doc['id']}").status_code == 200
        _error(vera.get(f"{PREFIX}/inbox/{doc['id']}/content"), 403, "viewer")
        r = olga.post(f"{PREFIX}/inbox/ack", json={"ids": [doc["id"]]}, headers={"x-csrf-token": csrf})
        assert r.json()["acknowledged"] == 1
        assert olga.get("/inbox").status_code == 200 and olga.get("/send").status_code == 200
        assert vera.get("/send").status_code == 403


# ---------------------------------------------------------------- described, and partners


def test_the_openapi_document_is_served_and_names_every_route(api: ApiCluster) -> None:
    with api.client(A) as anon:
        spec = anon.get(f"{PREFIX}/openapi.json").json()
        assert spec["openapi"].startswith("3.1")
        assert set(spec["paths"]) == {PREFIX + e.path for e in ENDPOINTS}
        assert "/api/v1/documents" in anon.get(f"{PREFIX}/docs").text


def test_partners_answers_as_the_admin_partners_command(api: ApiCluster) -> None:
    with api.client(A, "alice") as alice:
        _send(alice, f"{B}/bob", b"<order id='P-1'/>", key="P-1")
        admin = admin_request(api.dir(A) / "admin.sock", "partners")
        assert admin.get("ok"), admin
        r = alice.get(f"{PREFIX}/partners")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["partners"], got  # the fixture's documents made A partners
    assert {p["org"] for p in got["partners"]} == {p["org"] for p in admin["result"]["partners"]}
    assert all({"online", "backlog_out", "backlog_in", "cert_expires_ms", "link"} <= set(p) for p in got["partners"])


# ---------------------------------------------------------------- pure parts


def test_the_openapi_document_comes_from_the_route_table() -> None:
    spec = openapi("9.9")
    for e in ENDPOINTS:
        op = spec["paths"][PREFIX + e.path][e.method.lower()]
        assert op["operationId"] == e.name and str(e.status) in op["responses"]
        assert {p["name"] for p in op["parameters"]} == {p.name for p in e.params}
        assert ("security" in op) == (not e.auth)
    assert ENDPOINTS[1].matches("POST", "/documents") and not ENDPOINTS[1].matches("GET", "/documents")
    content = next(e for e in ENDPOINTS if e.name == "content")
    assert content.matches("GET", "/inbox/7/content") and not content.matches("GET", "/inbox//content")


def test_slots_bound_each_caller_and_wrong_tokens_per_address() -> None:
    now = [0.0]
    s = Slots(total=3, each=2, failures=API_AUTH_FAILURES, clock=lambda: now[0])
    s.take("alice")
    s.take("alice")
    with pytest.raises(ApiError) as e:
        s.take("alice")
    assert e.value.status == 429 and e.value.limit == 2
    s.take("bob")
    with pytest.raises(ApiError) as e:
        s.take("carol")
    assert e.value.limit == 3
    s.give("alice")
    s.take("carol")
    for _ in range(API_AUTH_FAILURES):
        s.refused("10.0.0.1")
        s.failed("10.0.0.1")
    with pytest.raises(ApiError) as e:
        s.refused("10.0.0.1")
    assert e.value.status == 429 and e.value.value == API_AUTH_FAILURES
    s.refused("10.0.0.2")  # another address is not held
    now[0] += 61
    s.refused("10.0.0.1")  # a minute later it is let in again
    # Tokens being checked count: parallel guesses cannot all pass the look before one fails.
    for _ in range(API_AUTH_FAILURES):
        s.refused("10.0.0.3")
        s.checking("10.0.0.3", +1)
    with pytest.raises(ApiError):
        s.refused("10.0.0.3")
    for _ in range(API_AUTH_FAILURES):
        s.checking("10.0.0.3", -1)  # (all were right)
    s.refused("10.0.0.3")


def test_a_body_that_stalls_is_refused_408_after_its_block_time() -> None:
    from starlette.requests import Request

    app = ApiApp.__new__(ApiApp)  # (only its body reader: no service needed)

    async def main() -> None:
        first = [True]

        async def receive() -> dict[str, Any]:
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": b"x" * 1000, "more_body": True}
            await trio.sleep_forever()
            raise AssertionError

        req = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
        with pytest.raises(ApiError) as e:
            async for _ in app._body_blocks(req, 5000):
                pass
        assert e.value.status == 408 and "1000 of 5000" in str(e.value)
        assert trio.current_time() >= API_BLOCK_S

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_send_options_are_parsed_and_named_when_wrong() -> None:
    assert parse_options({"to": "20002", "priority": "3", "ack2": "false", "expires_in": "60"}) == (
        "20002", {"priority": 3, "ack2": False, "expires_in": 60.0})
    for q, word in (({}, "to="), ({"to": "1", "ack2": "maybe"}, "ack2"), ({"to": "1", "expires_in": "0"}, "0")):
        with pytest.raises(ApiError) as e:
            parse_options(q)
        assert e.value.status == 400 and word in str(e.value)
