"""The pure parts of the console's Outbox and platform pages: the filters
an operator types, the actions a state takes, the words shown."""

from __future__ import annotations

import pytest

from semq.web.backend import ActionError
from semq.web.pages_outbox import (
    OutboxQuery,
    _state,
    age_text,
    allowed,
    origin_actions,
    parse_age,
    reason,
    state_words,
)
from semq.web.pages_platform import size_text


@pytest.mark.parametrize(("text", "seconds"), [("", None), ("90", 90), ("90s", 90), ("10m", 600), ("10 min", 600),
                                               ("2h", 7200), ("1.5d", 129600), ("0", 0)])
def test_ages_as_typed(text: str, seconds: float | None) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["-5", "5x", "1e9", "nan", "h", "10 m s"])
def test_bad_ages_name_the_value(text: str) -> None:
    with pytest.raises(ActionError, match=f"age {text!r} is not a number of seconds"):
        parse_age(text)


def test_states_as_typed_and_checked() -> None:
    assert [_state(t) for t in ("failed", "SS_FAILED", "ack_fwd", "confirmed", "ACK2", "", "bogus")] == [
        "SS_FAILED", "SS_FAILED", "SS_ACK_FWD", "confirmed", "confirmed", "", "bogus"]
    with pytest.raises(ActionError, match=r"state 'bogus' is not one of SS_INIT, .*, confirmed"):
        OutboxQuery(state="bogus").check()
    with pytest.raises(ActionError, match="target 'ACME' is not an organization's number"):
        OutboxQuery(target="ACME").check()
    assert OutboxQuery(state="SS_SENT", target="56001", age="2h").check() == 7200


def test_each_state_is_offered_what_it_takes() -> None:
    assert allowed("SS_INIT") == ["purge"]
    assert allowed("SS_SENT") == allowed("SS_ACK_FWD") == allowed("SS_ACK") == ["resend", "purge"]
    assert allowed("SS_FAILED") == ["requeue", "purge"]
    assert allowed("SS_ACK2") == [] and allowed("SS_NEWER") == []


def test_words() -> None:
    assert state_words("SS_ACK") == "stored at the platform (SS_ACK)" and state_words("X") == "X"
    assert reason("SS_FAILED", "40004", 300) == "UNKNOWN_TARGET (300)"
    assert reason("SS_FAILED", "40004", 65000) == "result code 65000" and reason("SS_ACK", "1", 0) == ""
    assert [size_text(n) for n in (0, 512, 2048, 3 << 20, 5 << 30)] == ["0 B", "512 B", "2.0 KiB", "3.0 MiB",
                                                                         "5.0 GiB"]
    now = 10_000_000
    assert [age_text(now - s * 1000, now) for s in (5, 600, 3 * 3600, 3 * 86400)] == ["5 s", "10 min", "3.0 h",
                                                                                     "3.0 d"]
    assert age_text(None, now) == ""


def test_a_documents_page_offers_what_its_state_takes() -> None:
    assert origin_actions("ack_save") == ["resend", "purge"] and origin_actions("nack") == ["requeue", "purge"]
    assert origin_actions("queued") == ["purge"] and origin_actions("ack2") == []
    assert origin_actions("something_new") == ["resend", "requeue", "purge"]
