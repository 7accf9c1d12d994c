"""Who may use the console: `opledger operator add|disable`, password sign-in, sessions that
expire, CSRF on every form (sign-in included), the trusted-header SSO mode, and the refusal
to start without any operator. Real `opledger console` processes, spoken to over HTTP.

The refusals are real `opledger` processes (forked from one that imported the command once:
`tests.consoles.opledger_forked`), and so is one `opledger operator add` that succeeds: the
only test that runs that command itself (the others add operators through the library call
it makes, `tests.consoles.add_operator`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from opledger.dev.processes import free_port
from tests.conftest import connect_ledger
from tests.consoles import (
    PASSWORD,
    Job,
    add_operator,
    console_client,
    csrf_of,
    opledger_forked,
    opledger_here,
    sign_in,
)

add = add_operator


@contextmanager
def console(env: dict[str, str], tmp_path: Path, *args: str) -> Iterator[httpx.Client]:
    with console_client(env, tmp_path / "c.log", *args, forked=True) as client:
        yield client


def test_the_console_refuses_to_start_without_an_operator(env: dict[str, str]) -> None:
    [done] = opledger_forked(Job(["console", "--port", str(free_port())], env))
    assert done.returncode == 4
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "opledger console: no operator accounts: add one with "
        "`opledger operator add NAME --tenant TENANT --by YOU`"
    ]


def test_operator_add_refuses_bad_input_and_keeps_only_a_hash(
    env: dict[str, str], database_url: str
) -> None:
    adding = ["operator", "add", "alice"]
    short, nowhere, added, again, listed, nobody = opledger_forked(  # in this order
        Job([*adding, "--tenant", "acme", "--by", "t", "--password-stdin"], env, stdin="short\n"),
        Job([*adding, "--by", "t", "--password-stdin"], env, stdin=PASSWORD + "\n"),
        Job(
            [*adding, "--tenant", "acme", "--tenant", "globex", "--by", "t", "--password-stdin"],
            env,
            stdin=PASSWORD + "\n",
        ),
        Job([*adding, "--all-tenants", "--by", "t", "--sso-only"], env),
        Job(["operator", "list", "--json"], env),
        Job(["operator", "disable", "nobody", "--by", "t"], env),
    )
    assert short.returncode == 3 and "at least 12 characters" in short.stderr
    assert nowhere.returncode == 3 and "--tenant" in nowhere.stderr
    assert added.returncode == 0, added.stderr
    assert "operator alice added: acts for acme, globex, signs in with a password" in added.stdout
    assert again.returncode == 3 and "exists already" in again.stderr
    with connect_ledger(database_url) as conn:
        stored = conn.execute("SELECT password_hash FROM operators WHERE name = 'alice'").fetchone()
    assert stored is not None and stored[0].startswith("$argon2id$") and PASSWORD not in stored[0]
    assert '"tenants": [\n      "acme",\n      "globex"\n    ]' in listed.stdout
    assert nobody.returncode == 3


def test_password_sign_in_csrf_sessions_that_expire_and_disabling(
    env: dict[str, str], tmp_path: Path
) -> None:
    add(env, "alice", "--tenant", "acme")
    with console(env, tmp_path, "--idle-minutes", "0.04") as client:  # 2.4 s idle
        assert client.get("/").headers["location"].startswith("/login")
        assert sign_in(client, "alice", "wrong password!!").status_code == 401
        assert sign_in(client, "mallory").status_code == 401
        no_token = client.post("/login", data={"name": "alice", "password": PASSWORD})
        assert no_token.status_code == 403 and "CSRF" in no_token.text
        signed = sign_in(client, "alice")
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        queue = client.get("/")
        assert queue.status_code == 200 and "signed in as <strong" in queue.text
        assert queue.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in queue.headers["content-security-policy"]
        # every form needs the session's token: signing out too
        assert client.post("/logout", data={}).status_code == 403
        assert client.get("/").status_code == 200
        time.sleep(3.0)  # idle past the timeout
        assert client.get("/").headers["location"].startswith("/login")

        assert sign_in(client, "alice").status_code == 303
        assert client.get("/").status_code == 200
        disabled = opledger_here(env, "operator", "disable", "alice", "--by", "admin")
        assert disabled.returncode == 0, disabled.stderr
        assert client.get("/").headers["location"].startswith("/login")  # ended at once
        assert sign_in(client, "alice").status_code == 401

        add(env, "carol", "--tenant", "acme")
        assert sign_in(client, "carol").status_code == 303
        out = client.post("/logout", data={"csrf_token": csrf_of(client.get("/"))})
        assert out.status_code == 303
        assert client.get("/").headers["location"].startswith("/login")


def test_the_trusted_header_mode_trusts_only_the_proxy_and_known_operators(
    env: dict[str, str], tmp_path: Path
) -> None:
    add(env, "bob@corp", "--tenant", "globex", "--sso-only")
    with console(
        env, tmp_path, "--trusted-header", "X-Remote-User", "--trusted-proxy", "127.0.0.1"
    ) as client:
        assert client.get("/").status_code == 401  # the proxy sent no name
        stranger = client.get("/", headers={"X-Remote-User": "eve@corp"})
        assert stranger.status_code == 403 and "no enabled operator" in stranger.text
        page = client.get("/", headers={"X-Remote-User": "bob@corp"})
        assert page.status_code == 200 and "bob@corp" in page.text
        assert (
            client.get(
                "/t/acme/ops/op_01M8PYGRXXJST91GFNVPW3KG4N", headers={"X-Remote-User": "bob@corp"}
            ).status_code
            == 404
        )
        refused = client.post(
            "/t/globex/ops/op_01M8PYGRXXJST91GFNVPW3KG4N/resolve",
            data={"note": "x"},
            headers={"X-Remote-User": "bob@corp"},
        )
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert client.post("/login", data={"name": "bob@corp"}).status_code == 403
    with console(
        env, tmp_path, "--trusted-header", "X-Remote-User", "--trusted-proxy", "10.0.0.0/8"
    ) as client:
        spoofed = client.get("/", headers={"X-Remote-User": "bob@corp"})
        assert spoofed.status_code == 403 and "SSO proxy" in spoofed.text
