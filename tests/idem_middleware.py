"""Contacts, a small CRM behind an idempotency middleware that does what express-idempotency
1.0.6 does with its defaults (read from its source, dist/services/idempotencyService.js and
dist/defaults/), as a real HTTP server on loopback:

- keys in the process's memory, until it restarts (`restart()` forgets them all and keeps
  the CRM's contacts, which are its database);
- a new key is recorded before the route runs; the answer is stored only when it is 2xx,
  any other answer deletes the key (after the route's commit too);
- the same key again: the stored status and body, unmarked; while the first request runs:
  409; another method, URL or body under the key: 417;
- the route (the CRM's own code) skips itself on a replay (the middleware's `isHit`),
  writes the contact with the caller's `ref` in one step, and `GET /contacts?ref=` reads them.

Faults, armed per key or for the next request (`arm`): `error_after_commit` (the contact is
written, then a 500: the key is released) and `crash_after_commit` (the contact is written,
then the process dies: no answer, and it comes back without its keys). The routes
`/_admin/faults`, `/_admin/restart` and `/_admin/config` are those of opledger's sandbox, so
`SandboxFaults` (`opledger contract check --admin-url`) can drive it.

`build_registry` is the `OPLEDGER_ADAPTERS` factory of the workers that test it: the
example's Contacts adapter with the contract of the docs, and beside it the same adapter
under `contacts_naive.create.v1` with a contract that over-promises (`over_promising`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from examples.adapter_contacts import ContactsAdapter, contacts_contract
from opledger.adapters.defaults import build_registry as bundled_registry
from opledger.adapters.registry import Registry
from opledger.dev.processes import free_port
from opledger.ledger.contract import Contract, Idempotency, Lookup
from opledger.settings import Settings

NAIVE = "contacts_naive.create.v1"
FAULTS = ("error_after_commit", "crash_after_commit")


def over_promising(request_timeout: timedelta = timedelta(seconds=10)) -> Contract:
    """The Tickets guide's facts copied for this middleware: durable keys, nothing applied
    on an error, no lookup. Each of them is false here."""
    return Contract(
        provider="contacts-naive",
        effect="contact",
        idempotency=Idempotency(
            kind="keyed",
            retention=timedelta(hours=24),
            after_error="nothing_applied",
            keys_durable=True,
            payload_checked=True,
            concurrent="conflict",
        ),
        response_binds="key",
        lookup=Lookup(kind="none"),
        request_timeout=request_timeout,
        max_in_flight=request_timeout * 2,
        source="copied from the Tickets guide: wrong for express-idempotency",
    )


class NaiveContacts(ContactsAdapter):
    """The same adapter, under another action, trusting `over_promising`."""

    actions: tuple[str, ...] = (NAIVE,)
    descriptions: ClassVar[Mapping[str, str]] = {NAIVE: "Create a CRM contact (over-promising)."}


def build_registry(settings: Settings) -> Registry:
    url = os.environ["CONTACTS_URL"]
    timeout = timedelta(seconds=settings.provider_timeout_seconds)
    registry = bundled_registry(settings)
    registry.register(ContactsAdapter(url, contract=contacts_contract(timeout)))
    registry.register(NaiveContacts(url, contract=over_promising(timeout)))
    return registry


@dataclass
class _Resource:
    """What the middleware keeps under a key: the request, and its answer once stored."""

    request: tuple[str, str, Any]
    response: tuple[int, bytes] | None = None


@dataclass
class ContactsServer:
    """The CRM (its contacts survive restarts) and the middleware's memory (which does not)."""

    port: int = field(default_factory=free_port)
    contacts: list[dict[str, Any]] = field(default_factory=list)
    #: how many times the route ran (a replay, a 409 or a 417 does not run it)
    route_runs: int = 0
    restarts: int = 0
    processing_s: float = 0.0
    _keys: dict[str, _Resource] = field(default_factory=dict)
    _faults: list[tuple[str, str | None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def restart(self) -> None:
        """The process ends and starts again: every key is forgotten, the contacts stay."""
        self.stop()
        with self._lock:
            self._keys.clear()
            self.restarts += 1
        self.start()

    def arm(self, mode: str, key: str | None = None) -> None:
        """The next request (with `key`, when given) that runs the route meets `mode`."""
        if mode not in FAULTS:
            raise ValueError(mode)
        with self._lock:
            self._faults.append((mode, key))

    def with_ref(self, ref: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self.contacts if c["ref"] == ref]

    # -- what a request meets --------------------------------------------------------------

    def admit(self, key: str, request: tuple[str, str, Any]) -> tuple[int, bytes] | None:
        """The middleware before the route: an answer of its own, or None to run the route."""
        with self._lock:
            found = self._keys.get(key)
            if found is None:
                self._keys[key] = _Resource(request)
                return None
        if found.request != request:
            return 417, _error("Misuse of the idempotency key. Please check your request.")
        if found.response is None:
            return 409, _error("A previous request is still in progress for this key.")
        return found.response  # replayed as stored, nothing says so

    def answered(self, key: str | None, status: int, body: bytes) -> None:
        """The middleware after the route: a 2xx is stored, anything else deletes the key."""
        if key is None:
            return
        with self._lock:
            if key not in self._keys:
                return
            if 200 <= status < 300:
                self._keys[key].response = (status, body)
            else:
                del self._keys[key]

    def fault_for(self, key: str | None) -> str | None:
        with self._lock:
            for i, (mode, armed) in enumerate(self._faults):
                if armed is None or armed == key:
                    del self._faults[i]
                    return mode
        return None

    def create(self, body: Any) -> tuple[int, bytes]:
        """The route: the contact and its ref, written together."""
        if not isinstance(body, dict) or not body.get("email") or not body.get("ref"):
            return 400, _error("a contact needs an email and a ref", code="invalid_contact")
        with self._lock:
            self.route_runs += 1
            contact = {
                "id": f"c_{len(self.contacts) + 1}",
                "email": body["email"],
                "name": body.get("name", ""),
                "ref": body["ref"],
            }
            self.contacts.append(contact)
        return 201, json.dumps(contact).encode()


def _error(message: str, code: str | None = None) -> bytes:
    """The Contacts app's error handler: `res.status(...).json(...)`."""
    error: dict[str, str] = {"message": message}
    if code:
        error["code"] = code
    return json.dumps({"error": error}).encode()


class _Handler(BaseHTTPRequestHandler):
    server_owner: ContactsServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> Any:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/contacts":
            return self._send(404, _error("not found"))
        ref = (parse_qs(url.query).get("ref") or [""])[0]
        self._send(200, json.dumps({"data": self.server_owner.with_ref(ref)}).encode())

    def do_POST(self) -> None:
        owner, body = self.server_owner, self._body()
        path = urlsplit(self.path).path
        if path.startswith("/_admin/"):
            return self._admin(path, body or {})
        if path != "/contacts":
            return self._send(404, _error("not found"))
        key = self.headers.get("Idempotency-Key")
        if key is not None:
            answer = owner.admit(key, ("POST", self.path, body))
            if answer is not None:  # the route sees `isHit` and returns
                return self._send(*answer)
        if owner.processing_s:
            time.sleep(owner.processing_s)
        fault = owner.fault_for(key)
        status, answer_body = owner.create(body)
        if fault == "crash_after_commit" and status == 201:
            owner.restart()  # committed; the process dies before it answers
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if fault == "error_after_commit" and status == 201:
            status, answer_body = 500, _error("the CRM failed after saving the contact")
        owner.answered(key, status, answer_body)
        return self._send(status, answer_body)

    def _admin(self, path: str, body: dict[str, Any]) -> None:
        """The sandbox's admin routes, as far as this server has them."""
        owner = self.server_owner
        if path == "/_admin/restart":
            forgotten = len(owner._keys)
            owner.restart()
            return self._send(200, json.dumps({"ok": True, "keys_forgotten": forgotten}).encode())
        if path == "/_admin/faults" and body.get("mode") in FAULTS:
            owner.arm(str(body["mode"]), body.get("key"))
            return self._send(200, b'{"ok": true}')
        if path == "/_admin/config" and set(body) <= {"account", "processing_s"}:
            owner.processing_s = float(body.get("processing_s", owner.processing_s))
            return self._send(200, b'{"ok": true}')
        return self._send(400, _error(f"not supported here: {path} {sorted(body)}"))


@contextmanager
def contacts_server() -> Iterator[ContactsServer]:
    server = ContactsServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
