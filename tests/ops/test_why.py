"""The "why" of a waiting document (semq.ops.why), sans-IO: every reason
of the table is reached from some state, each answer is filled in whole
(no placeholder left), and nothing waits once a document is confirmed."""

from __future__ import annotations

from typing import Any

import pytest

from semq.ops.why import REASONS, DaemonView, Doc, Presence, why, why_line
from semq.umxt_protocol import ResultCode

T = 1_796_620_000_000
TARGET = "56001"

CASES: dict[str, tuple[Doc, Presence, DaemonView]] = {
    "daemon_stopped": (Doc(state="SS_INIT", target=TARGET), Presence(), DaemonView(running=False)),
    "platform_unreachable": (Doc(state="SS_INIT", target=TARGET), Presence(),
                             DaemonView(connected=False, disconnected_ms=T)),
    "certificate_unknown": (Doc(state="SS_INIT", target=TARGET, code=int(ResultCode.CERT_NOT_TRUSTED)), Presence(),
                            DaemonView()),
    "over_quota": (Doc(state="SS_INIT", target=TARGET), Presence(), DaemonView(over_quota=frozenset({TARGET}))),
    "window_full": (Doc(state="SS_INIT", target=TARGET), Presence(), DaemonView(in_flight=64, window=64)),
    "queued": (Doc(state="SS_INIT", target=TARGET, created_ms=T), Presence(), DaemonView(window=64)),
    "platform_ack_missing": (Doc(state="SS_SENT", target=TARGET, sent_ms=T), Presence(), DaemonView()),
    "partner_offline": (Doc(state="SS_ACK", target=TARGET), Presence(online=False, since_ms=T, told_ms=T + 5),
                        DaemonView()),
    "partner_online_unconfirmed": (Doc(id=7, state="SS_ACK", target=TARGET, state_ms=T),
                                   Presence(online=True, since_ms=T, told_ms=T), DaemonView()),
    "stored_presence_unknown": (Doc(state="SS_ACK", target=TARGET), Presence(), DaemonView()),
    "forwarded_unconfirmed": (Doc(id=7, state="SS_ACK_FWD", target=TARGET, state_ms=T),
                              Presence(online=False, since_ms=T), DaemonView()),
    "failed": (Doc(id=7, state="SS_FAILED", target=TARGET, code=int(ResultCode.EXPIRED), attempts=3), Presence(),
               DaemonView()),
    "held_ordered": (Doc(held={"origin": "10008", "channel": "ORDERS", "waits_for": "10008/1/1/5",
                               "since_ms": T}), Presence(), DaemonView()),
}


def test_every_reason_of_the_table_is_reached() -> None:
    assert set(CASES) == set(REASONS)


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_reason_is_filled_in_whole(code: str) -> None:
    w: Any = why(*CASES[code])
    assert w is not None and w["code"] == code
    for field in ("where", "reason", "action"):
        assert w[field] and "{" not in w[field] and "}" not in w[field], (field, w[field])
    line = why_line(w)
    assert line.startswith(f"why: {w['where']}: {w['reason']}. What to do: ") and "\n" not in line


def test_what_each_line_names() -> None:
    w: Any = why(*CASES["partner_offline"])
    assert w["reason"].startswith(f"{TARGET} is offline since ") and w["since_ms"] == T
    assert f"the platform delivers it when {TARGET} connects" in w["action"]
    never: Any = why(Doc(state="SS_ACK", target=TARGET), Presence(online=False, told_ms=T), DaemonView())
    assert "has never seen it connected" in never["reason"]
    cert: Any = why(*CASES["certificate_unknown"])
    assert "CERT_NOT_TRUSTED" in cert["reason"] and f"semq node trust {TARGET}" in cert["action"]
    held: Any = why(*CASES["held_ordered"])
    assert "10008/1/1/5" in held["reason"] and held["where"].endswith("(ordered channel ORDERS)")
    failed: Any = why(*CASES["failed"])
    assert failed["reason"] == "gave up: EXPIRED after 3 attempts" and "semq admin requeue 7" in failed["action"]


def test_nothing_waits_once_confirmed() -> None:
    assert why(Doc(state="SS_ACK2", target=TARGET)) is None
    assert why_line(None).startswith("why: nothing waits")


def test_a_node_of_several_units_answers_its_partners_as_one() -> None:
    from semq.ops.partners import merge_partners

    def row(**kw: Any) -> dict[str, Any]:
        base = {"org": TARGET, "online": None, "since_ms": None, "last_seen_ms": None, "told_ms": None,
                "backlog_out": 0, "backlog_in": 0, "oldest_waiting_ms": None, "cert_expires_ms": None,
                "link": "none", "link_detail": None, "known_from": []}
        return base | kw

    one = {"partners": [row(backlog_out=2, oldest_waiting_ms=T + 50, told_ms=T, online=False, since_ms=T - 9,
                            known_from=["outbox"])], "asked_ms": T, "connected": True}
    two = {"partners": [row(backlog_out=1, backlog_in=4, oldest_waiting_ms=T, told_ms=T + 7, online=True,
                            since_ms=T + 5, link="up", known_from=["inbox"]),
                        row(org="77000", known_from=["pins"])], "asked_ms": T + 9, "connected": False}
    got = merge_partners([one, two])
    first, second = got["partners"]
    assert (first["org"], first["backlog_out"], first["backlog_in"], first["oldest_waiting_ms"]) == (TARGET, 3, 4, T)
    # What the platform said last wins; a link up on any unit is up.
    assert (first["online"], first["since_ms"], first["told_ms"], first["link"]) == (True, T + 5, T + 7, "up")
    assert first["known_from"] == ["inbox", "outbox"] and second["org"] == "77000"
    assert got["asked_ms"] == T + 9 and got["connected"] is True


async def test_the_why_request_refuses_what_is_not_an_lk0_in_one_line() -> None:
    from semq.ops.admin import AdminCommandError
    from semq.ops.partners import partner_handlers

    handlers = partner_handlers(object(), object())  # (refused before either is asked anything)
    for bad in ("", "10008/1/1", "10008/x/1/2", "a b/1/1/2", "10008/1/1/2\n"):
        with pytest.raises(AdminCommandError, match="is not NODE/SEMQ_ID/DB_ID/RECORD_ID") as e:
            await handlers["why"]({"lk0": bad})
        assert "\n" not in str(e.value).replace("\\n", "")


def test_a_channel_name_from_another_organization_is_text_not_a_template() -> None:
    w: Any = why(Doc(held={"origin": "10008", "channel": "{target.__class__}\x1b[2J", "waits_for": "10008/1/1/5",
                           "since_ms": T}))
    assert "{target.__class__}" in w["where"]
    assert "\x1b" not in why_line(w) and "\\x1b[2J" in why_line(w)
