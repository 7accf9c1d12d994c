"""A real MTA that limits us: Debian's postfix with its own per-client limits (anvil),
answering "not now" beyond them. The worker's steps run in this process against the real
ledger; the recipient's mailbox (dovecot) counts what was delivered.

Postfix refuses a client over its message rate with a 4yz reply and an enhanced status of
4.7.x: the SMTP adapter reads it as the server's "not now" (it applied nothing), the
provider is paused for the contract's wait, nothing counts toward a review, and the
message goes out once, after the wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from opledger.adapters.registry import Registry
from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract
from opledger.ledger import Ledger, Status
from opledger.ledger.contract import Limits
from opledger.tasks import steps
from opledger.tasks.steps import Step
from tests.intents import prepare, smtp_mail
from tests.mailservers import MailServers, mailservers

LEASE = timedelta(seconds=10)
#: anvil's counting window, and the wait the contract takes after a "not now" (SMTP names
#: none): past it the client's count starts again
WINDOW_S = 3
#: two messages per window from one client; loopback is not exempt (its default is mynetworks)
POSTFIX_LIMITS = f"""\
anvil_rate_time_unit = {WINDOW_S}s
smtpd_client_message_rate_limit = 2
smtpd_client_event_limit_exceptions =
"""


@pytest.fixture(scope="module")
def mail() -> Iterator[MailServers]:
    with mailservers(POSTFIX_LIMITS) as servers:
        yield servers


def test_a_real_mta_over_its_rate_says_not_now_and_the_message_goes_once_after_the_wait(
    ledger: Ledger, grant: str, mail: MailServers
) -> None:
    contract = smtp_contract(
        request_timeout=timedelta(seconds=5),
        limits=Limits(retry_after_default=timedelta(seconds=WINDOW_S)),
    )
    registry = Registry([SmtpAdapter(mail.host, mail.smtp_port, contract=contract)])
    rig = Ledger(ledger.engine, actions=registry)
    ops = [prepare(rig, f"limited-{i}", **smtp_mail(f"n{i}", f"message {i}")) for i in range(3)]

    def dispatch(op_id: str) -> steps.StepResult:
        return steps.dispatch(rig, registry, op_id, owner="w1", lease=LEASE)

    assert [dispatch(op_id).action for op_id in ops[:2]] == [Step.DISPATCHED] * 2
    refused = ops[2]
    dispatch(refused)  # the third in the window: postfix says not now
    history = rig.history(refused)
    assert history.operation.status is Status.UNKNOWN
    (said,) = [e for e in history.evidence if e.detail.get("code") == "throttled"]
    assert said.detail["smtp_code"] in (421, 450, 451, 452), said.detail
    assert " 4.7." in said.detail["reason"], said.detail
    (state,) = [p for p in rig.providers() if p.provider == "smtp"]
    assert state.paused and "SMTP 4" in (state.pause_reason or ""), state

    # reconciled at once: the wait is the provider's, nobody is asked, nothing is sent
    assert steps.reconcile(rig, registry, refused, owner="w2", lease=LEASE).action is Step.WAITING
    assert len(rig.history(refused).attempts) == 1 and not rig.history(refused).reviews

    time.sleep(WINDOW_S + 0.5)  # the wait asked for has passed, and anvil's window with it
    result = steps.reconcile(rig, registry, refused, owner="w2", lease=LEASE)
    assert result.action is Step.DISPATCHED, result
    history = rig.history(refused)
    assert history.operation.status is Status.CONFIRMED
    assert len(history.attempts) == 2 and not history.reviews
    for op_id in ops:  # each delivered once, the refused one included
        mail.wait_for_copies(message_id_for(rig.get(op_id)), 1, user="owner", folder="INBOX")
        assert mail.copies(message_id_for(rig.get(op_id)), user="owner", folder="INBOX") == 1
    registry.close()
