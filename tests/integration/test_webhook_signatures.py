"""Signed review webhooks, checked the way a receiver would: docs/webhooks.md's receiver
(examples/verify_webhook.py, standard library only) runs inside a real HTTP server on
loopback and verifies the requests the real webhook adapter sends it for a notification
the ledger prepared. A tampered body, a wrong secret and a stale timestamp are refused;
during a rotation a receiver with either secret accepts; a retry re-signs the same body.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from examples.verify_webhook import TOLERANCE_SECONDS, BadSignature, verify
from opledger.adapters.webhook import WebhookAdapter
from opledger.ledger import Claim, Confirmed, Rejected
from opledger.signatures import HEADER
from opledger.signatures import TOLERANCE_SECONDS as SENDER_TOLERANCE
from tests.posts import receiving

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "webhooks.md"
EXAMPLE = REPO / "examples" / "verify_webhook.py"

CURRENT = "c" * 24 + "-current-secret-0001"
PREVIOUS = "p" * 24 + "-previous-secret-001"
STRANGER = "s" * 24 + "-someone-elses-00001"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A webhook receiver on loopback that verifies each request with the docs' `verify`
    and the secrets it accepts: 204 when it passes, 401 when not."""

    url: str = ""
    secrets: list[str] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        self.requests.append(Received(headers, body))
        try:
            verify(body, headers.get(HEADER.lower(), ""), self.secrets)
        except BadSignature as exc:
            self.refusals.append(str(exc))
            return 401
        return 204


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()
    with receiving(state.handle, "/hooks/reviews") as state.url:
        yield state


def _signed_at(request: Received) -> int:
    match = re.match(r"t=(\d+),", request.headers[HEADER.lower()])
    assert match, request.headers
    return int(match.group(1))


# -- the docs show the receiver as it is -----------------------------------------------------


def test_the_docs_show_the_example_receiver_as_it_is() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.M | re.S)
    assert blocks == [EXAMPLE.read_text()]
    assert TOLERANCE_SECONDS == SENDER_TOLERANCE == 300  # the docs' 5 minutes


def test_the_example_receiver_imports_only_the_standard_librarys_hmac_hashlib_and_time() -> None:
    imports = re.findall(r"^(?:import|from) (\S+)", EXAMPLE.read_text(), re.M)
    assert sorted(imports) == ["hashlib", "hmac", "time"]


# -- real requests, verified by the receiver -------------------------------------------------


def test_a_signed_notification_is_accepted_with_its_exact_body_and_idempotency_key(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [CURRENT]
    outcome = adapters(receiver.url, CURRENT).dispatch(claim)
    assert isinstance(outcome, Confirmed), (outcome, receiver.refusals)
    [request] = receiver.requests
    assert request.body == claim.payload_canonical.encode()
    assert request.headers["idempotency-key"] == claim.idempotency_key
    assert len(re.findall(r"v1=[0-9a-f]{64}", request.headers[HEADER.lower()])) == 1


def test_a_tampered_body_is_refused(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [CURRENT]
    assert isinstance(adapters(receiver.url, CURRENT).dispatch(claim), Confirmed)
    [request] = receiver.requests
    header = request.headers[HEADER.lower()]
    verify(request.body, header, [CURRENT])
    tampered = request.body.replace(b'"rev_1"', b'"rev_2"')
    assert tampered != request.body
    for body in (tampered, request.body + b" ", request.body[:-1]):
        with pytest.raises(BadSignature, match="no signature"):
            verify(body, header, [CURRENT])
    # nor may the timestamp be moved to another second: it is part of the signed string
    t = _signed_at(request)
    with pytest.raises(BadSignature, match="no signature"):
        verify(request.body, header.replace(f"t={t},", f"t={t - 1},"), [CURRENT], now=t)


def test_a_receiver_with_another_secret_refuses_and_the_notification_is_rejected(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [STRANGER]
    outcome = adapters(receiver.url, CURRENT).dispatch(claim)
    assert isinstance(outcome, Rejected) and outcome.code == "http_401", outcome
    assert receiver.refusals == ["no signature made with a secret this receiver accepts"]


def test_an_unsigned_request_is_refused(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [CURRENT]
    outcome = adapters(receiver.url).dispatch(claim)
    assert isinstance(outcome, Rejected), outcome
    assert HEADER.lower() not in receiver.requests[0].headers
    assert receiver.refusals == ["malformed Opledger-Signature header"]


def test_a_stale_timestamp_is_refused_past_five_minutes_either_way(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [CURRENT]
    # sent signed ten minutes ago (a captured request replayed): the receiver refuses it
    old = adapters(receiver.url, CURRENT, clock=lambda: time.time() - 600)
    assert isinstance(old.dispatch(claim), Rejected)
    assert receiver.refusals == ["timestamp outside the tolerance: stale, replayed or a bad clock"]
    # the same request, as received: good within 300 s of its t, refused beyond
    request = receiver.requests[0]
    header, t = request.headers[HEADER.lower()], _signed_at(request)
    for now in (t, t + 300, t - 300):
        assert verify(request.body, header, [CURRENT], now=now) == t
    for now in (t + 301, t - 301):
        with pytest.raises(BadSignature, match="outside the tolerance"):
            verify(request.body, header, [CURRENT], now=now)


def test_during_a_rotation_a_receiver_with_either_secret_accepts(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    rotating = adapters(receiver.url, CURRENT, PREVIOUS)
    for accepted in ([PREVIOUS], [CURRENT], [STRANGER, CURRENT]):
        receiver.secrets = accepted
        assert isinstance(rotating.dispatch(claim), Confirmed), (accepted, receiver.refusals)
    header = receiver.requests[0].headers[HEADER.lower()]
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64},v1=[0-9a-f]{64}", header), header
    # once the previous secret is unset, a receiver still on it refuses
    receiver.secrets = [PREVIOUS]
    assert isinstance(adapters(receiver.url, CURRENT).dispatch(claim), Rejected)


def test_a_retry_re_signs_the_same_body_under_the_same_key_at_its_own_time(
    receiver: Receiver, claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver.secrets = [CURRENT]
    sends = iter([time.time() - 60, time.time()])
    adapter = adapters(receiver.url, CURRENT, clock=lambda: next(sends))
    assert isinstance(adapter.dispatch(claim), Confirmed)
    assert isinstance(adapter.dispatch(claim), Confirmed)  # the same operation, again
    first, second = receiver.requests
    assert first.body == second.body == claim.payload_canonical.encode()
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert _signed_at(second) - _signed_at(first) in (59, 60, 61)
    assert first.headers[HEADER.lower()] != second.headers[HEADER.lower()]
    # deterministic: the same body at the same second signs the same
    fixed = adapters(receiver.url, CURRENT, clock=lambda: float(_signed_at(first)))
    body = claim.payload_canonical.encode()
    assert fixed.headers(body, "k")[HEADER] == first.headers[HEADER.lower()]


def test_the_secret_is_never_logged(
    receiver: Receiver,
    claim: Claim,
    adapters: Callable[..., WebhookAdapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver.secrets = [STRANGER]  # a refusal too: its reason is recorded
    caplog.set_level(logging.DEBUG)
    adapter = adapters(receiver.url, CURRENT, PREVIOUS)
    outcome = adapter.dispatch(claim)
    assert caplog.records  # httpx's request line at least: the capture works
    said = caplog.text + repr(outcome) + repr(adapter) + repr(vars(adapter))
    assert CURRENT not in said and PREVIOUS not in said
