"""A provider restarted between our send and our lookup, in real Celery workers: Stripe's
answer to the charge is cut after the charge was made, stripe-stateful-mock restarts
(its keys, and every object, gone), the lookups after the in-flight deadline find
nothing, the resend under the same key charges again and Stripe answers a fresh 200
without `Idempotent-Replayed`. The operation is confirmed on that receipt, and a review
names the possible duplicate: never a silent confirmation."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from opledger.dev.processes import Stack, wait_until
from opledger.ledger import Ledger, Status
from opledger.ledger.evidence import POSSIBLE_DUPLICATE
from opledger.tasks.app import dispatch
from tests.stripemock import StripeMock, install

from .test_stripe import CHARGE, order, payment, stripe_worker

pytestmark = [pytest.mark.system, pytest.mark.long]


class RestartableMock(StripeMock):
    """stripe-stateful-mock that can restart on its port, forgetting everything."""

    def restart(self) -> None:
        self.stop()
        env = {**os.environ, "PORT": str(self.port), "LOG_LEVEL": "warn"}
        self._proc = subprocess.Popen(
            ["node", str(install())],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, 30, "stripe-stateful-mock to answer again", every=0.05)


@pytest.fixture
def mock() -> Iterator[RestartableMock]:
    mock = RestartableMock()
    mock.start()
    try:
        yield mock
    finally:
        mock.stop()


def test_a_fresh_charge_after_a_provider_restart_opens_a_review_of_a_possible_duplicate(
    running: Stack, ledger: Ledger, database_url: str, mock: RestartableMock
) -> None:
    # 4 s in flight: the restart is over long before the first lookup or resend may start
    with stripe_worker(
        running, ledger, database_url, mock, OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS="4"
    ) as rig:
        rig.proxy.cut_response(after=b"POST /v1/charges", times=1)
        op = rig.prepare(CHARGE, order(), payment())
        dispatch.delay(op.id)
        wait_until(lambda: rig.proxy.fired.get("cut") == 1, 15, "the charge's answer cut")
        assert len(mock.charges(op.marker)) == 1  # charged; our answer lost
        mock.restart()  # the provider's key store (and its records) lost
        assert mock.charges(op.marker) == []
        rig.proxy.close_connections()

        history = rig.settle(op)
        assert history.operation.status is Status.CONFIRMED
        first, second = history.attempts
        assert first.response is not None and first.response["code"] == "connection_lost"
        assert second.idempotency_key == first.idempotency_key
        assert second.started_at >= first.deadline_at
        assert second.response is not None and second.response["detail"]["replayed"] is False
        assert len(mock.charges(op.marker)) == 1  # the second charge: two in all
        review = history.open_review
        assert review is not None, "a silent confirmation of a possible second charge"
        assert review.reason.startswith(POSSIBLE_DUPLICATE), review.reason
        assert review.snapshot["fresh_success"]["attempt"] == 2
        assert [a["n"] for a in review.snapshot["earlier_attempts"]] == [1]
        [listed] = rig.ledger.reviews.list(tenant="acme", reason=POSSIBLE_DUPLICATE)
        assert listed.op_id == op.id
