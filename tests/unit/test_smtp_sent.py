"""The SMTP adapter's Sent-folder search, without servers: what the decision does with its
contract (rules 3 and 6), what a found copy binds, and the settings that configure it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opledger.adapters.imap import SentFolder
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import Evidence
from opledger.ledger.decide import (
    AskProvider,
    Confirm,
    Decision,
    HoldUnknown,
    NeedsReview,
    Wait,
    decide,
)
from opledger.settings import Settings, SettingsInvalid
from tests.unit.histories import DIGEST, T0, attempt, evidence, grant, operation

IN_FLIGHT = timedelta(seconds=20)
LAG = timedelta(seconds=60)
SEARCH = smtp_contract(
    request_timeout=timedelta(seconds=10), max_in_flight=IN_FLIGHT, sent_search_lag=LAG
)
SMTP = operation(action="email.smtp_send.v1", target="owner@acme.test", provider="smtp")
CUT = evidence("inconclusive", source="dispatch", attempt_n=1, code="connection_lost")


def _decide(now_s: float, *more: Evidence) -> Decision:
    """The decision at `now_s` seconds after the cut send started, with `more` evidence."""
    at = T0 + timedelta(seconds=now_s)
    return decide(SEARCH, SMTP, [attempt(in_flight=IN_FLIGHT)], [CUT, *more], grant(), at)


@given(st.floats(min_value=0, max_value=IN_FLIGHT.total_seconds() - 0.001))
def test_no_search_while_the_send_may_be_in_flight(now_s: float) -> None:
    """Rule 3 covers a search as it does a status API: nothing is asked before the
    in-flight deadline, not even a read."""
    decision = _decide(now_s)
    assert isinstance(decision, Wait) and not isinstance(decision, AskProvider)
    assert decision.until == T0 + IN_FLIGHT


@given(st.floats(min_value=0, max_value=LAG.total_seconds() - 0.001))
def test_inside_the_lag_it_holds_without_asking(after_deadline_s: float) -> None:
    decision = _decide(IN_FLIGHT.total_seconds() + after_deadline_s)
    assert isinstance(decision, HoldUnknown) and decision.next_check == T0 + IN_FLIGHT + LAG


def test_after_the_lag_it_searches_once_then_a_person_decides() -> None:
    visible = (IN_FLIGHT + LAG).total_seconds()
    assert isinstance(_decide(visible), AskProvider)
    missing = evidence("inconclusive", at=T0 + IN_FLIGHT + LAG, hits=0)
    decision = _decide(visible + 1, missing)
    assert isinstance(decision, NeedsReview)  # rule 6: absence proves nothing; no dedup
    early = evidence("inconclusive", at=T0 + IN_FLIGHT + LAG / 2, hits=0)
    assert isinstance(_decide(visible + 1, early), AskProvider)  # looked before the lag ended


def test_a_found_copy_confirms_when_it_binds_our_key_target_and_body() -> None:
    found = evidence("confirmed", at=T0 + IN_FLIGHT + LAG, target="owner@acme.test", digest=DIGEST)
    decision = _decide((IN_FLIGHT + LAG).total_seconds() + 1, found)
    assert isinstance(decision, Confirm) and decision.evidence_id == found.id
    other_body = evidence("confirmed", at=T0 + IN_FLIGHT + LAG, digest="b" * 64)
    assert not isinstance(_decide((IN_FLIGHT + LAG).total_seconds() + 1, other_body), Confirm)
    not_ours = evidence("confirmed", at=T0 + IN_FLIGHT + LAG, key="op_other")
    assert not isinstance(_decide((IN_FLIGHT + LAG).total_seconds() + 1, not_ours), Confirm)


def test_without_a_sent_folder_an_ambiguous_send_goes_to_a_person_without_a_lookup() -> None:
    plain = smtp_contract(request_timeout=timedelta(seconds=10), max_in_flight=IN_FLIGHT)
    decision = decide(plain, SMTP, [attempt(in_flight=IN_FLIGHT)], [CUT], grant(), T0 + IN_FLIGHT)
    assert isinstance(decision, NeedsReview)


ENV = {
    "OPLEDGER_SMTP_SENT_IMAP_HOST": "imap.example.com",
    "OPLEDGER_SMTP_SENT_IMAP_USER": "ops@example.com",
    "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": "app-password-123",
}


def test_the_settings_take_all_of_it_or_nothing() -> None:
    settings = Settings.from_environ(ENV)
    assert settings.smtp_sent_imap_tls == "imaps" and settings.smtp_sent_folder == "Sent"
    assert "app-password-123" not in repr(settings)
    assert "app-password-123" not in settings.model_dump_json()
    for missing in ("USER", "PASSWORD"):
        env = {k: v for k, v in ENV.items() if not k.endswith(missing)}
        with pytest.raises(SettingsInvalid, match=f"OPLEDGER_SMTP_SENT_IMAP_{missing}"):
            Settings.from_environ(env)
    with pytest.raises(SettingsInvalid, match="OPLEDGER_SMTP_SENT_IMAP_PASSWORD"):
        Settings.from_environ({**ENV, "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": ""})
    with pytest.raises(SettingsInvalid, match="in the clear"):
        Settings.from_environ({**ENV, "OPLEDGER_SMTP_SENT_IMAP_TLS": "none"})
    local = {**ENV, "OPLEDGER_SMTP_SENT_IMAP_HOST": "127.0.0.1"}
    assert Settings.from_environ({**local, "OPLEDGER_SMTP_SENT_IMAP_TLS": "none"})
    with pytest.raises(SettingsInvalid, match="OPLEDGER_SMTP_SENT_FOLDER"):
        Settings.from_environ({**ENV, "OPLEDGER_SMTP_SENT_FOLDER": "Gesendete Objekte ä"})
    with pytest.raises(SettingsInvalid, match="OPLEDGER_SMTP_SENT_IMAP_TLS"):
        Settings.from_environ({**ENV, "OPLEDGER_SMTP_SENT_IMAP_TLS": "ssl"})
    unset = Settings.from_environ({"OPLEDGER_SMTP_SENT_IMAP_HOST": " "})
    assert unset.smtp_sent_imap_host is None  # no search, nothing else required


def test_a_sent_folder_never_shows_its_password() -> None:
    folder = SentFolder(host="imap.example.com", user="u", password="hunter2-secret")
    assert "hunter2-secret" not in repr(folder) and "hunter2-secret" not in folder.describe()
    assert folder.server == "imap.example.com:993"
    assert SentFolder(host="h", user="u", password="p", tls="starttls").server == "h:143"
    with pytest.raises(ValueError, match="loopback"):
        SentFolder(host="imap.example.com", user="u", password="p", tls="none")
