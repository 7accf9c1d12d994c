""" "Never reached the provider" is one fact, whatever the transport: an HTTP provider, an
SMTP server and an upstream MCP server that refuse the connection each give the outcome
`unreached` makes, and the rules read it the same way — retried, counted by the provider's
breaker, never sent to a person, whatever adapter reported it (and whichever release
recorded it)."""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta

import httpx
import pytest

from opledger.adapters.base import outcome_for_http_error
from opledger.adapters.crm import crm_contract
from opledger.adapters.mcp import McpToolAdapter, Upstream, UpstreamTool
from opledger.adapters.smtp import outcome_for_smtp_connect_error, smtp_contract
from opledger.ledger.decide import Dispatch, NeedsReview, decide
from opledger.ledger.evidence import NO_CONNECTION, NOT_SENT, never_reached, own_unsent
from opledger.ledger.models import Ambiguous, Outcome
from opledger.ledger.pressure import pressure_of
from tests.unit.histories import DIGEST, KEY, T0, attempt, claim, evidence, grant, operation

S = timedelta(seconds=1)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening: connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _http(port: int) -> Outcome:
    try:
        httpx.post(f"http://127.0.0.1:{port}/cases", timeout=2)
    except httpx.HTTPError as exc:
        return outcome_for_http_error(exc)
    raise AssertionError("a closed port answered")


def _smtp(port: int) -> Outcome:
    try:
        smtplib.SMTP("127.0.0.1", port, timeout=2)
    except OSError as exc:
        return outcome_for_smtp_connect_error(exc)
    raise AssertionError("a closed port answered")


def _mcp(port: int) -> Outcome:
    upstream = Upstream(
        url=f"http://127.0.0.1:{port}/mcp",
        timeout_seconds=2,
        effects={"create_ticket": UpstreamTool(action="tickets.create_ticket.v1")},
    )
    return McpToolAdapter(upstream).dispatch(claim())


@pytest.mark.parametrize("send", [_http, _smtp, _mcp], ids=["http", "smtp", "mcp"])
def test_every_transport_says_a_refused_connection_the_same_way(
    send: Callable[[int], Outcome], closed_port: int
) -> None:
    outcome = send(closed_port)
    assert isinstance(outcome, Ambiguous)
    assert outcome.code == NOT_SENT and outcome.detail["why"] == NO_CONNECTION, outcome
    assert never_reached(outcome)
    # the provider's breaker counts it: a refusing provider is paused, not its operations
    assert pressure_of(outcome, crm_contract().limits).kind == "refused"


@pytest.mark.parametrize("why", [NO_CONNECTION, "not_connected"])
def test_attempts_that_never_reached_the_provider_never_go_to_a_person(why: str) -> None:
    """Eight attempts refused at the door (as an earlier release recorded an MCP upstream's
    too: `not_connected`) are sent again; five sent too late are our own, and a person looks."""
    op = operation()
    attempts = [attempt(n) for n in range(1, 9)]
    refused = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="not_sent", why=why)
        for n in range(1, 9)
    ]
    assert all(never_reached(ev) for ev in refused) and own_unsent(refused) == 0
    decision = decide(smtp_contract(request_timeout=10 * S), op, attempts, refused, grant(), T0)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)

    late = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="not_sent", why="window_passed")
        for n in range(1, 6)
    ]
    assert not any(never_reached(ev) for ev in late) and own_unsent(late) == 5
    decision = decide(smtp_contract(request_timeout=10 * S), op, attempts[:5], late, grant(), T0)
    assert isinstance(decision, NeedsReview) and "none of which reached" in decision.reason
