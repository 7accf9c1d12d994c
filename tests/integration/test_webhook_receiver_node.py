"""Signed review webhooks, verified by a receiver in another language written from
docs/webhooks.md alone: tests/webhook_receiver/receiver.mjs (Node.js, its own `http` and
`crypto` only) runs as a real process on loopback, and the real webhook adapter sends it a
notification the ledger prepared. A valid request verifies; a tampered body or timestamp, a
wrong secret, a stale or future timestamp and an unsigned request do not (401, which the
adapter records as a refusal); during a rotation a receiver with either secret verifies;
a re-signed retry is the same notification by its Idempotency-Key.

Without `node` on PATH the tests are skipped on a laptop and fail in CI.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from opledger.adapters.webhook import WebhookAdapter
from opledger.ledger import Claim, Confirmed, Rejected
from opledger.signatures import HEADER

RECEIVER = Path(__file__).resolve().parents[1] / "webhook_receiver" / "receiver.mjs"

CURRENT = "c" * 24 + "-current-secret-0001"
PREVIOUS = "p" * 24 + "-previous-secret-001"
STRANGER = "s" * 24 + "-someone-elses-00001"


def _require_node() -> str:
    node = shutil.which("node")
    if node is None:
        why = "node not installed: the docs-only webhook receiver is a Node.js program"
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)
    return node


class NodeReceiver:
    """One receiver.mjs process on a free loopback port, accepting `secrets`."""

    def __init__(self, node: str, secrets: tuple[str, ...]) -> None:
        env = {**os.environ, "RECEIVER_SECRETS": " ".join(secrets)}
        self._proc = subprocess.Popen(
            [node, str(RECEIVER), "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], 15)
        line = self._proc.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"receiver.mjs did not start: {line!r}")
        self.base = f"http://127.0.0.1:{line}"
        self.url = f"{self.base}/hooks/reviews"

    def log(self) -> list[dict[str, Any]]:
        """What the receiver recorded, one entry per POST: `verified`, `reason`, ..."""
        entries: list[dict[str, Any]] = httpx.get(f"{self.base}/log", timeout=5).json()
        return entries

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def receivers() -> Iterator[Callable[..., NodeReceiver]]:
    node = _require_node()
    started: list[NodeReceiver] = []

    def start(*secrets: str) -> NodeReceiver:
        started.append(NodeReceiver(node, secrets))
        return started[-1]

    yield start
    for receiver in started:
        receiver.stop()


Rewrite = Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]]


@pytest.fixture
def tamperer() -> Iterator[Callable[[str, Rewrite], str]]:
    """A man in the middle on loopback: it forwards each POST to `target` after `rewrite`
    changed its headers or body, and answers with the target's status."""
    servers: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def start(target: str, rewrite: Rewrite) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                keep = ("content-type", "idempotency-key", HEADER.lower())
                headers = {k: v for k, v in self.headers.items() if k.lower() in keep}
                headers, body = rewrite(headers, body)
                status = httpx.post(target, content=body, headers=headers, timeout=5).status_code
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}/hooks/reviews"

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _refused(outcome: object) -> bool:
    return isinstance(outcome, Rejected) and outcome.code == "http_401"


def test_a_signed_notification_verifies(
    receivers: Callable[..., NodeReceiver], claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver = receivers(CURRENT)
    outcome = adapters(receiver.url, CURRENT).dispatch(claim)
    assert isinstance(outcome, Confirmed), (outcome, receiver.log())
    [entry] = receiver.log()
    assert entry["verified"] is True and entry["reason"] is None, entry
    assert entry["idempotency_key"] == claim.idempotency_key
    assert entry["event"] == "review.opened"  # parsed only after it verified


def _moved_a_second_back(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    t = re.sub(r"t=(\d+)", lambda m: f"t={int(m[1]) - 1}", headers[HEADER])
    return {**headers, HEADER: t}, body


#: what a man in the middle changes in a signed request
TAMPERINGS: dict[str, Rewrite] = {
    "a body byte": lambda h, b: (h, b.replace(b'"rev_1"', b'"rev_2"')),
    "a byte added": lambda h, b: (h, b + b" "),
    "the last byte cut": lambda h, b: (h, b[:-1]),
    "t moved a second": _moved_a_second_back,
}


@pytest.mark.parametrize("change", TAMPERINGS)
def test_a_tampered_request_is_refused(
    change: str,
    receivers: Callable[..., NodeReceiver],
    tamperer: Callable[[str, Rewrite], str],
    claim: Claim,
    adapters: Callable[..., WebhookAdapter],
) -> None:
    receiver = receivers(CURRENT)
    seen: list[tuple[dict[str, str], bytes]] = []

    def record_and_rewrite(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        headers = {HEADER if k.lower() == HEADER.lower() else k: v for k, v in headers.items()}
        changed = TAMPERINGS[change](headers, body)
        assert changed != (headers, body), change
        seen.append(changed)
        return changed

    outcome = adapters(tamperer(receiver.url, record_and_rewrite), CURRENT).dispatch(claim)
    assert seen, "the tamperer saw no request"
    assert _refused(outcome), (change, outcome)
    [entry] = receiver.log()
    assert entry["verified"] is False and entry["reason"].startswith("bad signature"), entry


def test_a_receiver_with_another_secret_refuses(
    receivers: Callable[..., NodeReceiver], claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver = receivers(STRANGER)
    outcome = adapters(receiver.url, CURRENT).dispatch(claim)
    assert _refused(outcome), outcome
    [entry] = receiver.log()
    assert entry["verified"] is False and entry["reason"].startswith("bad signature"), entry


def test_an_unsigned_request_is_refused(
    receivers: Callable[..., NodeReceiver], claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver = receivers(CURRENT)
    outcome = adapters(receiver.url).dispatch(claim)
    assert _refused(outcome), outcome
    [entry] = receiver.log()
    assert entry["verified"] is False and entry["reason"].startswith("unsigned"), entry


@pytest.mark.parametrize("skew", [-600, -310, 310, 600])
def test_a_timestamp_more_than_five_minutes_away_is_refused_either_way(
    skew: int,
    receivers: Callable[..., NodeReceiver],
    claim: Claim,
    adapters: Callable[..., WebhookAdapter],
) -> None:
    receiver = receivers(CURRENT)
    # signed `skew` seconds off the receiver's clock: a replayed capture, or a bad clock
    outcome = adapters(receiver.url, CURRENT, clock=lambda: time.time() + skew).dispatch(claim)
    assert _refused(outcome), (skew, outcome)
    [entry] = receiver.log()
    assert entry["verified"] is False and entry["reason"].startswith("stale"), entry


@pytest.mark.parametrize("skew", [-290, 290])
def test_a_timestamp_within_five_minutes_verifies(
    skew: int,
    receivers: Callable[..., NodeReceiver],
    claim: Claim,
    adapters: Callable[..., WebhookAdapter],
) -> None:
    receiver = receivers(CURRENT)
    outcome = adapters(receiver.url, CURRENT, clock=lambda: time.time() + skew).dispatch(claim)
    assert isinstance(outcome, Confirmed), (skew, outcome, receiver.log())


def test_during_a_rotation_a_receiver_with_either_secret_verifies(
    receivers: Callable[..., NodeReceiver], claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    # the sender signs with the new secret first, then the one being replaced
    for accepted, matched in (((PREVIOUS,), 0), ((CURRENT,), 0), ((STRANGER, CURRENT), 1)):
        receiver = receivers(*accepted)
        outcome = adapters(receiver.url, CURRENT, PREVIOUS).dispatch(claim)
        assert isinstance(outcome, Confirmed), (accepted, outcome, receiver.log())
        [entry] = receiver.log()
        assert entry["verified"] is True and entry["secret_index"] == matched, (accepted, entry)
    # once the previous secret is unset on the sender, a receiver still on it refuses
    late = receivers(PREVIOUS)
    assert _refused(adapters(late.url, CURRENT).dispatch(claim))
    assert late.log()[0]["reason"].startswith("bad signature")


def test_a_re_signed_retry_verifies_and_is_the_same_notification(
    receivers: Callable[..., NodeReceiver], claim: Claim, adapters: Callable[..., WebhookAdapter]
) -> None:
    receiver = receivers(CURRENT)
    sends = iter([time.time() - 60, time.time()])
    adapter = adapters(receiver.url, CURRENT, clock=lambda: next(sends))
    assert isinstance(adapter.dispatch(claim), Confirmed)
    assert isinstance(adapter.dispatch(claim), Confirmed)  # the same operation, again
    first, second = receiver.log()
    assert first["verified"] and second["verified"], (first, second)
    assert first["idempotency_key"] == second["idempotency_key"] == claim.idempotency_key
    assert (first["duplicate"], second["duplicate"]) == (False, True)
