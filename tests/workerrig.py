"""A worker over the in-memory twin of the ledger, on a fake clock, with the real CRM
adapter talking to an httpx `MockTransport` (`Rig`): what `tests/unit/test_worker.py` and
`tests/integration/test_memory_twin.py` share."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import httpx

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.memory import FakeClock, MemoryLedger
from opledger.ledger import Operation
from opledger.ledger.decide import ReviewPolicy
from opledger.tasks.worker import FollowUps, Worker, WorkerConfig

LEASE = timedelta(seconds=30)


class FakeCrm:
    """The CRM's HTTP API as a MockTransport: a close applies once per key; a status
    lookup by key answers what it stored. `mode` says how the next close goes: "ok",
    "refuse" (the case does not exist), "lost" (applied, the answer lost), "dropped" (the
    request never arrived, the answer lost). `before_answer` runs while a call is in flight."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.stored: dict[str, dict[str, Any]] = {}
        self.applied = 0
        self.before_answer: Callable[[], None] = lambda: None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and "/requests/" in request.url.path:
            key = request.url.path.rsplit("/", 1)[1]
            if key not in self.stored:
                return httpx.Response(404, json={"error": {"code": "no_such_request"}})
            return httpx.Response(200, json=self.stored[key])
        key = request.headers["Idempotency-Key"]
        if self.mode == "refuse":
            return httpx.Response(404, json={"error": {"code": "case_not_found"}})
        if self.mode == "dropped":
            raise httpx.ReadTimeout("no answer", request=request)
        case = request.url.path.split("/")[-2]
        body = {
            "case_id": case,
            "status": "closed",
            "version": 2,
            "idempotency_key": key,
            "request_digest": hashlib.sha256(request.content).hexdigest(),
        }
        if key not in self.stored:
            self.applied += 1
            self.stored[key] = {"status_code": 200, "response": body}
        self.before_answer()
        if self.mode == "lost":
            raise httpx.ReadTimeout("answer lost", request=request)
        return httpx.Response(200, json=body)


class Rig:
    """A worker over the twin, its clock, the CRM, and what the worker asked to follow."""

    def __init__(self, *, lookup: str = "status_api", keys: bool = True) -> None:
        self.clock = FakeClock()
        self.crm = FakeCrm()
        contract = crm_contract(
            keys=keys,
            lookup=lookup,  # type: ignore[arg-type]
            request_timeout=timedelta(seconds=2),
            max_in_flight=timedelta(seconds=4),
        )
        mocked = httpx.Client(transport=httpx.MockTransport(self.crm))
        with patch("opledger.adapters.crm.http_client", lambda *_, **__: mocked):
            self.adapter = CrmAdapter("http://crm.test", account="acme", contract=contract)
        self.registry = Registry([self.adapter])
        self.ledger = MemoryLedger(clock=self.clock)  # a provider is an action's first part
        self.grant = self.ledger.grant(tenant="acme", scope=["crm.*"], granted_by="test").ref
        self.followed: list[tuple[str, str]] = []
        self.worker = Worker(
            self.ledger,
            self.registry,
            owner="w1",
            config=WorkerConfig(lease=LEASE, policy=ReviewPolicy(after=timedelta(hours=1))),
            clock=self.clock,
            sleep=self.clock.advance,
            follow_ups=FollowUps(
                reconcile=lambda op_id: self.followed.append(("reconcile", op_id)),
                review_opened=lambda op_id: self.followed.append(("review", op_id)),
            ),
        )

    def prepare(self, case: str = "case-1") -> Operation:
        return self.ledger.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"close-{case}",
            action="crm.close_case.v1",
            target=case,
            payload={"note": "done"},
            authorization_ref=self.grant,
        )

    def statuses(self, op_id: str) -> list[str]:
        return [t.to_status.value for t in self.ledger.history(op_id).transitions]
