"""The sandbox providers' limits and overload, against the real servers.

An account's writes (CRM case actions, email sends) pass a front door before the key is
read: over the account's concurrency or rate a request gets a 429 with Retry-After, while
overloaded a 503 with Retry-After, and either way nothing is applied and the key stays
free. The ground truth counts what the door admitted and refused, so a test can prove a
client kept within the limits. The bundled adapters read these answers as THROTTLED.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from opledger.adapters.base import THROTTLED
from opledger.adapters.crm import CrmAdapter
from opledger.adapters.email import EmailAdapter
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ambiguous, Confirmed
from tests.unit.histories import claim, operation

ACCOUNT = "limited"


@dataclass
class Answer:
    case: str
    key: str
    status: int
    retry_after: str | None
    code: str


def close_case(client: httpx.Client, case: str, key: str) -> Answer:
    response = client.post(
        f"/crm/{ACCOUNT}/cases/{case}/close", json={}, headers={"Idempotency-Key": key}
    )
    code = response.json().get("error", {}).get("code", "") if response.status_code >= 400 else ""
    return Answer(case, key, response.status_code, response.headers.get("retry-after"), code)


def at_once(sandbox: Sandbox, threads: int, per_thread: int, pause: float = 0.0) -> list[Answer]:
    """`threads` clients start together, each closing `per_thread` cases one after another
    (pausing `pause` seconds after each answer)."""
    answers: list[Answer] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def client(t: int) -> None:
        with httpx.Client(base_url=sandbox.http_url, timeout=10) as http:
            start.wait()
            for n in range(per_thread):
                answer = close_case(http, f"case-{t}-{n}", f"key-{t}-{n}")
                with lock:
                    answers.append(answer)
                time.sleep(pause)

    workers = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(answers) == threads * per_thread
    return answers


def test_requests_over_the_accounts_limits_get_429_and_apply_nothing(sandbox: Sandbox) -> None:
    sandbox.configure(ACCOUNT, max_concurrent=2, rate_per_s=20, burst=2, processing_s=0.05)
    answers = at_once(sandbox, threads=8, per_thread=4)
    admitted = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    assert len(admitted) + len(refused) == len(answers)
    assert admitted and refused  # 8 clients at once overrun 2 slots and 20/s
    for answer in refused:
        assert answer.code == "rate_limited"
        assert answer.retry_after is not None and int(answer.retry_after) >= 1

    limited = sandbox.limited(ACCOUNT)
    assert limited["over_limit"] == len(refused)
    assert limited["over_concurrency"] + limited["over_rate"] == len(refused)
    assert limited["admitted"] == len(admitted)
    assert limited["in_flight"] == 0
    assert 1 <= limited["max_in_flight"] <= 2
    # a token bucket admits at most its burst plus its rate over the time it admitted
    span = limited["last_admitted_at"] - limited["first_admitted_at"]
    assert limited["admitted"] <= 2 + 20 * span + 1e-6

    # nothing of a refused request was applied, and its key was never read
    truth = sandbox.truth()
    assert truth["by_act"] == {f"crm:{ACCOUNT}:close:{a.case}": 1 for a in admitted}
    assert {k for k in truth["requests"] if k.startswith("crm:")} == {
        f"crm:{a.key}" for a in admitted
    }
    # so the same key, sent again within the limits, is a first request, not a replay
    sandbox.configure(ACCOUNT, max_concurrent=0, rate_per_s=0)
    with httpx.Client(base_url=sandbox.http_url, timeout=10) as http:
        again = http.post(
            f"/crm/{ACCOUNT}/cases/{refused[0].case}/close",
            json={},
            headers={"Idempotency-Key": refused[0].key},
        )
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
    assert sandbox.by_act()[f"crm:{ACCOUNT}:close:{refused[0].case}"] == 1


def test_a_client_that_waits_for_its_answers_is_never_counted_twice(sandbox: Sandbox) -> None:
    """Two clients, each sending its next request as soon as it has read the last answer,
    never exceed two in flight: the provider's slot is freed before its answer is sent."""
    sandbox.configure(ACCOUNT, max_concurrent=2, processing_s=0.01)
    answers = at_once(sandbox, threads=2, per_thread=25)
    assert [a.status for a in answers] == [200] * 50
    limited = sandbox.limited(ACCOUNT)
    assert (limited["admitted"], limited["over_limit"], limited["max_in_flight"]) == (50, 0, 2)


def test_a_client_within_the_rate_is_never_refused(sandbox: Sandbox) -> None:
    sandbox.configure(ACCOUNT, max_concurrent=2, rate_per_s=20, burst=2)
    answers = at_once(sandbox, threads=1, per_thread=12, pause=1 / 12)
    assert [a.status for a in answers] == [200] * 12
    assert sandbox.limited(ACCOUNT)["over_limit"] == 0


def test_the_rate_limits_retry_after_is_the_whole_seconds_until_a_token(sandbox: Sandbox) -> None:
    sandbox.configure(ACCOUNT, rate_per_s=0.25, burst=1)
    with httpx.Client(base_url=sandbox.http_url, timeout=10) as http:
        first = close_case(http, "case-a", "key-a")
        second = close_case(http, "case-b", "key-b")
    assert first.status == 200
    assert (second.status, second.code) == (429, "rate_limited")
    assert second.retry_after is not None and 3 <= int(second.retry_after) <= 4  # ceil(~4 s)
    assert sandbox.limited(ACCOUNT)["over_rate"] == 1


def test_an_account_that_sent_nothing_reports_zeros(sandbox: Sandbox) -> None:
    report = sandbox.limited("nobody")
    assert (report["admitted"], report["over_limit"], report["max_in_flight"]) == (0, 0, 0)
    assert report["first_admitted_at"] is None


def test_an_overloaded_provider_answers_503_with_retry_after_and_applies_nothing(
    sandbox: Sandbox,
) -> None:
    sandbox.fault("crm", "overloaded", times=2, delay_s=3)
    with httpx.Client(base_url=sandbox.http_url, timeout=10) as http:
        answers = [close_case(http, "case-o", "key-o") for _ in range(3)]
    assert [(a.status, a.retry_after, a.code) for a in answers] == [
        (503, "3", "overloaded"),
        (503, "3", "overloaded"),
        (200, None, ""),
    ]
    truth = sandbox.truth()
    assert truth["by_act"] == {f"crm:{ACCOUNT}:close:case-o": 1}
    assert len(truth["requests"]["crm:key-o"]) == 1  # only the admitted one reached the key
    assert sandbox.limited(ACCOUNT)["overloaded"] == 2


def test_overload_is_only_for_the_providers_with_a_front_door(sandbox: Sandbox) -> None:
    with pytest.raises(httpx.HTTPStatusError):
        sandbox.fault("webhook", "overloaded")


# -- the bundled adapters read these answers as THROTTLED ---------------------------------------


def test_the_crm_adapter_reads_the_sandboxs_429_and_503_as_throttled(sandbox: Sandbox) -> None:
    adapter = CrmAdapter(sandbox.http_url, account=ACCOUNT)
    sandbox.configure(ACCOUNT, rate_per_s=0.5, burst=1)
    try:
        with httpx.Client(base_url=sandbox.http_url, timeout=10) as http:
            assert close_case(http, "case-x", "key-x").status == 200  # takes the one token
        limited = adapter.dispatch(claim())
        assert isinstance(limited, Ambiguous) and limited.code == THROTTLED
        assert limited.detail["status"] == 429 and limited.detail["code"] == "rate_limited"
        assert limited.detail["retry_after_s"] == 2.0  # ceil(1 / 0.5)

        sandbox.configure(ACCOUNT, rate_per_s=0)
        sandbox.fault("crm", "overloaded", delay_s=2.5)
        busy = adapter.dispatch(claim())
        assert isinstance(busy, Ambiguous) and busy.code == THROTTLED
        assert (busy.detail["status"], busy.detail["retry_after_s"]) == (503, 2.5)

        done = adapter.dispatch(claim())  # the same key, never taken by the refusals
        assert isinstance(done, Confirmed) and not done.detail["replayed"]
    finally:
        adapter.close()
    assert sandbox.by_act()[f"crm:{ACCOUNT}:close:case-318"] == 1
    assert adapter.contract.limits.throttle_applies_nothing


def test_the_email_adapter_reads_the_sandboxs_429_as_throttled(sandbox: Sandbox) -> None:
    adapter = EmailAdapter(sandbox.http_url, account=ACCOUNT)
    sandbox.configure(ACCOUNT, max_concurrent=1, processing_s=1.0)
    send = claim().model_copy(
        update={
            "operation": operation(action="email.send.v1", target="ann@example.com"),
            "payload": {"to": "ann@example.com", "subject": "hi"},
        }
    )
    occupied = threading.Thread(target=adapter.dispatch, args=(send,))
    try:
        occupied.start()
        deadline = time.monotonic() + 5
        while sandbox.limited(ACCOUNT)["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        outcome = adapter.dispatch(send)  # the account's one slot is taken
        occupied.join(10)
    finally:
        adapter.close()
    assert isinstance(outcome, Ambiguous) and outcome.code == THROTTLED
    assert outcome.detail["retry_after_s"] == 1.0
    assert sandbox.by_act() == {f"email:{ACCOUNT}:ann@example.com": 1}
    assert sandbox.limited(ACCOUNT)["over_concurrency"] == 1
