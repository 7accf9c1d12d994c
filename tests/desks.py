"""A reviewer's desk over a CRM without lookups (`Desk`): an operation whose response was
lost goes to review at once, no sleep until its in-flight deadline. Shared by the review
tests (`test_reviews`, `test_review_rules`) and the console's (`test_console_reviews`,
`test_console_signin`), through the `desk` fixture of `tests/integration/conftest.py`.

Reaching review needs the decision to see the attempt's in-flight deadline passed: the
worker's step is handed a clock (`past_deadlines`) rather than the test waiting for it.
Nothing else of a desk runs on that clock: the database, the sandbox and the review
rules keep real time, so a test about key retention still waits for it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger
from opledger.ledger.decide import ReviewPolicy
from opledger.tasks import steps
from tests.intents import prepare_op

LEASE = timedelta(seconds=5)
#: the tenants a desk's ledger grants the CRM to (as auth_<tenant>)
TENANTS = ("acme", "globex")


def not_before(instant: datetime) -> Callable[[], datetime]:
    """A clock for a worker's step (`steps.reconcile(now=...)`): real time, but never
    before `instant`."""
    return lambda: max(datetime.now(UTC), instant)


def past_deadlines(ledger: Ledger, op_id: str) -> Callable[[], datetime]:
    """A clock on which every attempt of `op_id` made so far has passed its in-flight
    deadline (by 50 ms)."""
    deadline = max(a.deadline_at for a in ledger.history(op_id).attempts)
    return not_before(deadline + timedelta(milliseconds=50))


class Desk:
    """A CRM without lookups (keyed or not), so a lost response ends in review; and a
    reviewer's desk over it. `facts`: the CRM contract's other facts (`crm_contract`),
    e.g. `retention=timedelta(seconds=2)` or `after_error="key_released"`."""

    def __init__(
        self, ledger: Ledger, sandbox: Sandbox, *, keys: bool = True, **facts: Any
    ) -> None:
        self.sandbox = sandbox
        if not keys:
            sandbox.configure(keys=False)
        contract = crm_contract(
            **{
                "request_timeout": timedelta(seconds=0.5),
                "max_in_flight": timedelta(seconds=1),
                "retention_margin": timedelta(0),
                **facts,
            },
            keys=keys,
            lookup="none",
        )
        self.adapter = CrmAdapter(sandbox.http_url, account="acme", contract=contract)
        self.registry = Registry([self.adapter])
        self.ledger = Ledger(ledger.engine, actions=self.registry)
        for tenant in TENANTS:
            self.ledger.grant(tenant=tenant, scope=["crm.*"], granted_by="t", ref=f"auth_{tenant}")

    def close(self) -> None:
        self.adapter.close()

    def in_review(self, key: str = "close", *, tenant: str = "acme") -> str:
        """An operation (tests.intents' usual one under `key`) whose response was lost,
        after a review was opened for it."""
        op = prepare_op(self.ledger, key, tenant=tenant, authorization_ref=f"auth_{tenant}")
        self.sandbox.fault("crm", "drop_after_commit", key=op.idempotency_key)
        steps.dispatch(self.ledger, self.registry, op.id, owner="w1", lease=LEASE)
        self.review(op.id)
        return op.id

    def review(self, op_id: str) -> None:
        """Reconcile `op_id` past its attempts' deadlines under a policy that asks a person
        after one attempt: it must go to review."""
        result = self.reconcile(op_id, policy=ReviewPolicy(after_attempts=1))
        assert result.action == "review", result

    def reconcile(self, op_id: str, **kw: Any) -> steps.StepResult:
        """`steps.reconcile` of `op_id` (as worker w2), on a clock past its attempts'
        in-flight deadlines unless `now` is given."""
        kw.setdefault("now", past_deadlines(self.ledger, op_id))
        return steps.reconcile(self.ledger, self.registry, op_id, owner="w2", lease=LEASE, **kw)

    def show(self, op_id: str, operator: str = "alice") -> Any:
        return self.ledger.reviews.show(op_id, tenant="acme", operator=operator)

    def resolve(
        self, op_id: str, how: str, *, operator: str = "alice", note: str = "n", **kw: Any
    ) -> Any:
        return self.ledger.reviews.resolve(
            op_id, tenant="acme", operator=operator, resolution=how, note=note, **kw
        )
