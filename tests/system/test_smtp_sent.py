"""A real worker and beat send email over postfix and look an ambiguous send up in the
mailbox's Sent folder (dovecot, IMAP), configured only through the worker's environment
and the bundled adapter registry."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from opledger.adapters.smtp import message_id_for
from opledger.dev.faultproxy import FaultProxy
from opledger.dev.processes import Stack
from opledger.ledger import Ledger, Status
from opledger.ledger.models import EvidenceSource
from opledger.tasks.app import dispatch
from tests.intents import prepare, smtp_mail
from tests.mailservers import MailServers, mailservers

from .conftest import settled, worker_with

pytestmark = pytest.mark.system

LAG_S = 2.0


@pytest.fixture(scope="module")
def mail() -> Iterator[MailServers]:
    with mailservers() as servers:
        yield servers


def mail_env(mail: MailServers, smtp_port: int, folder: str = "Sent") -> dict[str, Any]:
    """The worker's settings: the bundled registry, SMTP through `smtp_port`, and the Sent
    folder over STARTTLS, verified against the servers' own certificate. (Any, not str:
    unpacked into worker_with, whose concurrency is an int.)"""
    return {
        "OPLEDGER_ADAPTERS": "opledger.adapters.defaults:build_registry",
        "OPLEDGER_SMTP_HOST": "127.0.0.1",
        "OPLEDGER_SMTP_PORT": str(smtp_port),
        "OPLEDGER_SMTP_SENT_IMAP_HOST": "127.0.0.1",
        "OPLEDGER_SMTP_SENT_IMAP_PORT": str(mail.imap_port),
        "OPLEDGER_SMTP_SENT_IMAP_TLS": "starttls",
        "OPLEDGER_SMTP_SENT_IMAP_USER": mail.user,
        "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": mail.password,
        "OPLEDGER_SMTP_SENT_IMAP_CAFILE": mail.cafile,
        "OPLEDGER_SMTP_SENT_FOLDER": folder,
        "OPLEDGER_SMTP_SENT_SEARCH_LAG_SECONDS": str(LAG_S),
    }


def _lookups_after_deadline_and_lag(ledger: Ledger, op_id: str) -> list[dict[str, object]]:
    """The lookups made, each checked to have come after the send's in-flight deadline and
    the search lag (rule 3 and the lag rule, as the real worker applied them)."""
    history = ledger.history(op_id)
    visible = max(a.deadline_at for a in history.attempts) + timedelta(seconds=LAG_S)
    lookups = [e for e in history.evidence if e.source == EvidenceSource.LOOKUP]
    assert all(e.recorded_at >= visible for e in lookups), [
        (e.recorded_at, visible) for e in lookups
    ]
    return [e.detail for e in lookups]


def test_a_worker_confirms_a_cut_send_from_the_sent_folder_and_hands_an_uncopied_one_over(
    running: Stack, sys_ledger: Ledger, mail: MailServers
) -> None:
    with FaultProxy(("127.0.0.1", mail.smtp_port)) as proxy:
        with worker_with(running, **mail_env(mail, proxy.port)) as worker:
            plain = prepare(sys_ledger, "plain", **smtp_mail("receipt", "thanks"))
            dispatch.delay(plain)
            assert settled(sys_ledger, [plain]) == {plain: Status.CONFIRMED}
            assert _lookups_after_deadline_and_lag(sys_ledger, plain) == []  # its 250 says it

            proxy.cut_response(after=b"\r\n.\r\n", times=1)
            cut = prepare(sys_ledger, "cut", **smtp_mail("welcome", "hello"))
            dispatch.delay(cut)
            assert settled(sys_ledger, [cut], timeout=60) == {cut: Status.CONFIRMED}
            assert proxy.fired["cut"] == 1 and proxy.connections == 2  # never sent again
            history = sys_ledger.history(cut)
            assert history.evidence[0].detail["code"] == "connection_lost"
            found = _lookups_after_deadline_and_lag(sys_ledger, cut)
            assert found[-1]["accepted_only"] is True and found[-1]["folder"] == "Sent"
            assert history.operation.provider_result_id == message_id_for(history.operation)
        assert mail.password not in worker.output()

        # the same cut, with the search pointed at a folder the provider files nothing in
        with worker_with(running, **mail_env(mail, proxy.port, folder="Archive")) as worker:
            proxy.cut_response(after=b"\r\n.\r\n", times=1)
            lost = prepare(sys_ledger, "lost", **smtp_mail("welcome", "again"))
            dispatch.delay(lost)
            assert settled(sys_ledger, [lost], timeout=60) == {lost: Status.UNKNOWN}
            assert proxy.connections == 3
        assert mail.password not in worker.output()

    (review,) = sys_ledger.history(lost).reviews
    (searched,) = _lookups_after_deadline_and_lag(sys_ledger, lost)
    lost_id = message_id_for(sys_ledger.get(lost))
    assert searched["folder"] == "Archive" and searched["message_id"] == lost_id
    assert "not found" in str(searched["summary"])
    assert "'Archive'" in str(review.snapshot["search_hint"])
    assert lost_id in str(review.snapshot["search_hint"])

    # exactly one copy of each in the Sent folder, and one message each at the recipient
    for op_id in (plain, cut, lost):
        message_id = message_id_for(sys_ledger.get(op_id))
        mail.wait_for_copies(message_id, 1)
        assert mail.copies(message_id) == 1
        assert mail.copies(message_id, user="owner", folder="INBOX") == 1
    assert mail.copies(lost_id, folder="Archive") == 0
