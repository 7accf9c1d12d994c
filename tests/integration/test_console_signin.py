"""The console's sign-in and request checks, against real `opledger console` processes:
throttled sign-in (per name and per address, in the database, before any password check;
a bound on password checks at once), forms accepted only from the console's own pages,
a sign-in nonce the server signed, security headers on every answer, one SSO header, and
banners from the server's own record.

Two console processes with the default options are shared by the module's tests (each
test starts from no operator, session nor sign-in attempt: the `env` fixture, and clients
of its own); a test that needs other options starts its own. Every `opledger` process here
is forked from one that imported the command once (`tests.forks.fork_server`). Operators
are added through the library call `opledger operator add` makes (test_console_access.py
runs the command itself)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from opledger.dev.processes import free_port, unconfigured_environ
from opledger.dev.sandbox import Sandbox
from tests.conftest import connect_ledger
from tests.consoles import (
    PASSWORD,
    Job,
    add_operator,
    console_client,
    csrf_of,
    forget_accounts,
    opledger_forked,
    opledger_here,
    page_client,
    running_console,
    sign_in,
)
from tests.desks import Desk


@pytest.fixture(scope="module")
def module_env(
    database_url: str, sandbox_server: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """What the module's shared console processes run with: the test database, the
    sandbox's CRM (for resolutions), a state directory of their own."""
    state = tmp_path_factory.mktemp("consoles")
    return unconfigured_environ() | {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_STATE_DIR": str(state),
        "OPLEDGER_CRM_URL": sandbox_server.http_url,
    }


@pytest.fixture(scope="module")
def consoles(module_env: dict[str, str], database_url: str) -> Iterator[tuple[str, str]]:
    """Two `opledger console` processes with the default options: their base URLs."""
    forget_accounts(database_url)
    add_operator(module_env, "starter", "--tenant", "acme")  # none: it refuses to start
    log = Path(module_env["OPLEDGER_STATE_DIR"])
    with (
        running_console(module_env, log / "a.log", forked=True) as first,
        running_console(module_env, log / "b.log", forked=True) as second,
    ):
        yield first, second


@pytest.fixture
def a(consoles: tuple[str, str], env: dict[str, str]) -> Iterator[httpx.Client]:
    """A client of the first shared console, after `env` emptied the accounts."""
    with page_client(consoles[0]) as client:
        yield client


@pytest.fixture
def b(consoles: tuple[str, str], env: dict[str, str]) -> Iterator[httpx.Client]:
    """A client of the second shared console process."""
    with page_client(consoles[1]) as client:
        yield client


def checks_of(database_url: str, name: str) -> int:
    """How many password checks were recorded for `name`."""
    with connect_ledger(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM signin_attempts WHERE operator = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def sessions_of(database_url: str, name: str) -> int:
    with connect_ledger(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM console_sessions WHERE operator = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


# -- 1. brute force -----------------------------------------------------------------------


def test_wrong_passwords_lock_the_name_in_every_console_process_before_any_check(
    env: dict[str, str], a: httpx.Client, b: httpx.Client, database_url: str
) -> None:
    add_operator(env, "alice", "--tenant", "acme")
    answers = [sign_in(a, "alice", "wrong password!!") for _ in range(25)]
    statuses = [r.status_code for r in answers]
    assert statuses[:5] == [401] * 5, statuses
    assert statuses[5] == 429, statuses
    assert statuses.count(401) <= 6, statuses  # the first wait is 1 s, then 2 s, ...
    throttled = answers[5]
    wait = int(throttled.headers["retry-after"])
    assert 1 <= wait <= 2
    assert "too many failed sign-ins" in throttled.text and "UTC" in throttled.text
    # a refused attempt ran no password check: only the 401s are on record
    assert checks_of(database_url, "alice") == statuses.count(401)

    # the right password, from another console process, is refused while locked
    locked = sign_in(b, "alice")
    assert locked.status_code == 429 and "retry-after" in locked.headers
    assert sessions_of(database_url, "alice") == 0
    time.sleep(int(locked.headers["retry-after"]) + 0.2)
    assert sign_in(b, "alice").status_code == 303
    # a success starts the count again
    assert sign_in(a, "alice", "wrong again!!!!").status_code == 401

    audit = opledger_here(env, "operator", "audit", "alice")  # what the command prints
    assert audit.returncode == 0, audit.stderr
    assert audit.stdout.count("FAILED") == statuses.count(401) + 1
    assert "1 failed sign-in(s) since the last successful one" in audit.stdout


def test_unknown_names_are_answered_like_known_ones_and_an_address_is_throttled_too(
    env: dict[str, str], a: httpx.Client
) -> None:
    add_operator(env, "alice", "--tenant", "acme")

    def timed(client: httpx.Client, name: str) -> tuple[httpx.Response, float]:
        nonce = csrf_of(client.get("/login"))
        start = time.perf_counter()
        answer = client.post(
            "/login", data={"csrf_token": nonce, "name": name, "password": "not the password"}
        )
        return answer, time.perf_counter() - start

    client = a
    known = [timed(client, "alice") for _ in range(3)]
    unknown = [timed(client, "mallory") for _ in range(3)]
    for (k, _), (u, _) in zip(known, unknown, strict=True):
        assert k.status_code == u.status_code == 401
        assert k.text.replace(csrf_of(k), "") == u.text.replace(csrf_of(u), "")
    ratio = statistics.median(t for _, t in known) / statistics.median(t for _, t in unknown)
    assert 1 / 3 < ratio < 3, ratio  # both run one argon2 check
    # two more for the unknown name, and it waits like a known one would
    assert [timed(client, "mallory")[0].status_code for _ in range(2)] == [401, 401]
    assert timed(client, "mallory")[0].status_code == 429
    # one address trying many names: 20 failures (8 so far), then it waits
    for i in range(12):
        assert timed(client, f"guess-{i}")[0].status_code == 401
    from_here = sign_in(client, "alice")  # the right password, a name never locked
    assert from_here.status_code == 429 and "from this address" in from_here.text


def test_password_checks_beyond_the_bound_are_answered_at_once_not_queued(
    env: dict[str, str], a: httpx.Client
) -> None:
    add_operator(env, "alice", "--tenant", "acme")
    url = str(a.base_url).rstrip("/")
    clients = [httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) for _ in range(8)]
    nonces = [csrf_of(c.get("/login")) for c in clients]
    start = threading.Barrier(len(clients))
    answers: dict[int, tuple[httpx.Response, float]] = {}

    def attempt(i: int) -> None:
        start.wait()
        began = time.perf_counter()
        answer = clients[i].post(
            "/login",
            data={"csrf_token": nonces[i], "name": f"someone-{i}", "password": "x" * 12},
        )
        answers[i] = answer, time.perf_counter() - began

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    statuses = sorted(r.status_code for r, _ in answers.values())
    busy = [(r, took) for r, took in answers.values() if r.status_code == 503]
    assert set(statuses) == {401, 503} and len(busy) >= 3, statuses
    assert all(r.headers["retry-after"] == "1" for r, _ in busy)
    for r, _ in busy:
        assert_secured("503 busy", r)
    slowest_check = max(took for r, took in answers.values() if r.status_code == 401)
    assert all(took < slowest_check for _, took in busy)


# -- 3. where a form comes from -----------------------------------------------------------


def test_a_form_from_another_origin_or_with_a_planted_nonce_changes_nothing(
    env: dict[str, str], a: httpx.Client, database_url: str
) -> None:
    add_operator(env, "alice", "--tenant", "acme")
    add_operator(env, "mallory", "--tenant", "acme")
    client = a
    url = str(client.base_url).rstrip("/")
    other_port = f"http://127.0.0.1:{free_port()}"
    with httpx.Client(base_url=url, timeout=30) as victim:
        nonce = csrf_of(victim.get("/login"))
        form = {"csrf_token": nonce, "name": "mallory", "password": PASSWORD}
        for headers in (
            {"Origin": other_port},  # a page on another port of this host
            {"Origin": "null"},
            {"Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "cross-site"},
            {},  # says nothing of where it comes from
        ):
            refused = victim.post("/login", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert "did not come from a page of this console" in refused.text
            assert "set-cookie" not in refused.headers
        twice = victim.post("/login", data=form, headers=[("Origin", url), ("Origin", other_port)])
        assert twice.status_code == 403
        assert checks_of(database_url, "mallory") == 0  # refused before any check
        assert sessions_of(database_url, "mallory") == 0
        same = victim.post("/login", data=form, headers={"Sec-Fetch-Site": "same-origin"})
        assert same.status_code == 303

    # a nonce cookie planted by another page (cookies ignore ports), even posted with
    # the console's own origin, is not one the server signed
    with httpx.Client(base_url=url, timeout=30, headers={"Origin": url}) as planted:
        planted.cookies.set("opledger_login", "planted", domain="127.0.0.1")
        forged = planted.post(
            "/login", data={"csrf_token": "planted", "name": "mallory", "password": PASSWORD}
        )
        assert forged.status_code == 403 and "CSRF" in forged.text
    assert sessions_of(database_url, "mallory") == 1  # the same-origin sign-in only

    assert sign_in(client, "alice").status_code == 303
    token = csrf_of(client.get("/"))
    out = client.post("/logout", data={"csrf_token": token}, headers={"Origin": other_port})
    assert out.status_code == 403 and client.get("/").status_code == 200
    resolve = client.post(
        "/t/acme/ops/op_01M8PYGRXXJST91GFNVPW3KG4N/resolve",
        data={"csrf_token": token, "resolution": "cancel", "note": "x", "seen_version": "1"},
        headers={"Origin": other_port},
    )
    assert resolve.status_code == 403 and "this console" in resolve.text


def test_behind_a_proxy_only_the_public_origin_may_post(
    env: dict[str, str], tmp_path: Path
) -> None:
    add_operator(env, "alice", "--tenant", "acme")
    public = "https://review.example.com"
    with (
        running_console(env, tmp_path / "c.log", "--public-url", public + "/", forked=True) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        page = client.get("/login")
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Host-opledger_login=") and "Secure" in cookie
        nonce = csrf_of(page)
        form = {"csrf_token": nonce, "name": "alice", "password": PASSWORD}
        sent = {"Cookie": f"__Host-opledger_login={nonce}"}
        own = client.post("/login", data=form, headers=sent | {"Origin": url})
        assert own.status_code == 403  # the address it listens on is not the public one
        signed = client.post("/login", data=form, headers=sent | {"Origin": public})
        assert signed.status_code == 303
        assert signed.headers["set-cookie"].startswith("__Host-opledger_session=")
    [bad] = opledger_forked(Job(["console", "--public-url", f"{public}/console"], env))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "host alone" in bad.stderr


# -- 4. security headers ------------------------------------------------------------------

HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def test_every_answer_carries_the_security_headers(env: dict[str, str], a: httpx.Client) -> None:
    add_operator(env, "alice", "--tenant", "acme")
    client = a
    answers = {
        "303 not signed in": client.get("/"),
        "200 sign-in page": client.get("/login"),
        "401 wrong password": sign_in(client, "alice", "wrong password!!"),
        "403 no CSRF token": client.post("/login", data={"name": "alice"}),
        "403 another origin": client.post(
            "/login", data={}, headers={"Origin": "http://127.0.0.1:1"}
        ),
        "404 no such page": client.get("/no/such/page"),
        "405 wrong method": client.post("/healthz"),
        "200 static file": client.get("/static/console.css"),
    }
    for _ in range(4):
        sign_in(client, "alice", "wrong password!!")
    answers["429 throttled"] = sign_in(client, "alice")
    for what, answer in answers.items():
        assert answer.status_code == int(what.split()[0]), (what, answer.status_code)
        assert_secured(what, answer, data=not what.endswith("static file"))


def assert_secured(what: str, answer: httpx.Response, *, data: bool = True) -> None:
    """The console's security headers are on `answer` (and no-store if it holds data)."""
    for name, value in HEADERS.items():
        assert answer.headers.get(name) == value, (what, name)
    csp = answer.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, what
    store = answer.headers.get("cache-control")
    assert (store == "no-store") is data, (what, store)


# -- 5. the smaller ones ------------------------------------------------------------------


def test_one_sso_header_and_an_explicit_proxy(env: dict[str, str], tmp_path: Path) -> None:
    add_operator(env, "bob@corp", "--tenant", "globex", "--sso-only")
    [alone] = opledger_forked(Job(["console", "--trusted-header", "X-Remote-User"], env))
    assert alone.returncode == 2
    [line] = alone.stderr.strip().splitlines()
    assert "--trusted-proxy" in line
    with console_client(
        env,
        tmp_path / "c.log",
        "--trusted-header",
        "X-Remote-User",
        "--trusted-proxy",
        "127.0.0.1",
        forked=True,
    ) as client:
        assert client.get("/", headers={"X-Remote-User": "bob@corp"}).status_code == 200
        client.cookies.clear()
        two = client.get("/", headers=[("X-Remote-User", "bob@corp"), ("X-Remote-User", "eve")])
        assert two.status_code == 400 and "exactly one" in two.text
        assert "set-cookie" not in two.headers
    assert "2 X-Remote-User headers" in (tmp_path / "c.log").read_text()


def _resolve(client: httpx.Client, op_id: str, note: str) -> httpx.Response:
    review = client.get(f"/t/acme/ops/{op_id}/review")
    assert review.status_code == 200, review.text
    version = review.text.split('name="seen_version" value="', 1)[1].split('"', 1)[0]
    return client.post(
        f"/t/acme/ops/{op_id}/resolve",
        data={
            "csrf_token": csrf_of(review),
            "seen_version": version,
            "resolution": "cancel",
            "note": note,
        },
    )


def test_the_resolved_banner_comes_from_the_server_never_the_link(
    desk: Desk, env: dict[str, str], a: httpx.Client
) -> None:
    op_id = desk.in_review("banner")
    add_operator(env, "alice", "--tenant", "acme")
    client = a  # its OPLEDGER_CRM_URL is the desk's sandbox
    assert sign_in(client, "alice").status_code == 303
    crafted = client.get(f"/t/acme/ops/{op_id}/audit?done=confirmed&status=confirmed")
    assert crafted.status_code == 200 and "Resolved as" not in crafted.text
    done = _resolve(client, op_id, "nothing was sent: stop it")
    assert done.status_code == 303, done.text
    assert "?" not in done.headers["location"]
    banner = client.get(done.headers["location"])
    assert "Resolved as cancel" in banner.text and "is now cancelled" in banner.text
    assert "Resolved as" not in client.get(done.headers["location"]).text  # once


def test_a_note_may_have_line_breaks_but_no_other_control_characters(
    desk: Desk, env: dict[str, str], a: httpx.Client
) -> None:
    op_id = desk.in_review("lines")
    add_operator(env, "alice", "--tenant", "acme")
    client = a  # its OPLEDGER_CRM_URL is the desk's sandbox
    assert sign_in(client, "alice").status_code == 303
    bell = _resolve(client, op_id, "a bell \x07 in it")
    assert bell.status_code == 409 and "control" in bell.text
    done = _resolve(client, op_id, "first line\r\nsecond line\rthird")
    assert done.status_code == 303, done.text
    [action] = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.note == "first line\nsecond line\nthird"


@pytest.mark.parametrize("shared", [True, False])
def test_consoles_sharing_the_signin_key_accept_each_others_forms(
    env: dict[str, str], tmp_path: Path, a: httpx.Client, b: httpx.Client, shared: bool
) -> None:
    """Two console processes behind one name, no sticky sessions: a sign-in form one of
    them served is accepted by the other only when both sign with OPLEDGER_CONSOLE_SIGNIN_KEY
    (each process's own random key otherwise, as the module's two shared consoles do: reload
    the form)."""
    add_operator(env, "alice", "--tenant", "acme")
    with ExitStack() as stack:
        if shared:
            keyed = env | {"OPLEDGER_CONSOLE_SIGNIN_KEY": "k" * 40}
            first = stack.enter_context(console_client(keyed, tmp_path / "a.log", forked=True))
            second = stack.enter_context(console_client(keyed, tmp_path / "b.log", forked=True))
        else:
            first, second = a, b
        served = first.get("/login")
        nonce = csrf_of(served)
        second.cookies.update(first.cookies)
        posted = second.post(
            "/login", data={"csrf_token": nonce, "name": "alice", "password": PASSWORD}
        )
    if shared:
        assert posted.status_code == 303, posted.text
    else:
        assert posted.status_code == 403 and "reload" in posted.text.lower(), posted.text
