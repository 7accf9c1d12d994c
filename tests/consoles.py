"""Shared by the console's tests (and a few others that run `opledger`): the real `opledger`
command (a process of its own; or one forked from a server that imported the command once,
a real process all the same without a second or two of imports; or in this process through
Typer's test runner), operators added through the library call `opledger operator add`
makes, a running `opledger console` process until it answers its health check, an HTTP
client that speaks to it as its own pages do, and Debian's Chromium driven through its
chromedriver."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from opledger.dev.processes import Proc, free_port, listening, wait_until
from opledger.ledger.pgschema import SCHEMA_VARIABLE
from tests.clirun import Run
from tests.conftest import SCHEMA, connect_ledger
from tests.forks import ForkedProc, ForkServer, fork_server

if TYPE_CHECKING:  # the browser tests import Selenium only once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

    from opledger.console.accounts import Accounts

PASSWORD = "a long enough password"

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
)


def opledger(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`opledger ARGS` in a process of its own, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "opledger.cli", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def opledger_here(
    env: Mapping[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """`opledger ARGS` in this process (Typer's test runner: the same commands, without a
    process's second or two of imports), with the OPLEDGER_ settings of `env` alone and the
    settings read afresh; for what a command prints, never for what a process does."""
    from typer.testing import CliRunner

    from opledger.cli.main import app
    from opledger.settings import get_settings

    settings: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OPLEDGER_")}
    settings |= {k: v for k, v in env.items() if k.startswith("OPLEDGER_")}
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, list(args), input=stdin, env=settings)
    finally:
        get_settings.cache_clear()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@dataclass(frozen=True)
class Job:
    """One `opledger ARGS` process of `opledger_forked`: its environment (all of it), its
    directory and what its stdin holds."""

    args: Sequence[str]
    env: Mapping[str, str]
    cwd: Path | None = None
    stdin: str = ""
    timeout: float = 60.0


def opledger_forked(*jobs: Job, together: bool = False) -> list[subprocess.CompletedProcess[str]]:
    """Each job's `opledger ARGS` in a process of its own, its output captured, as
    `opledger` run by itself: forked from a server that imported the command once
    (`fork_server`), instead of each paying for its imports. One after the other in order,
    or all `together`."""
    with tempfile.TemporaryDirectory(prefix="opledger-forks-") as tmp:
        started: list[tuple[ForkServer, int]] = []
        codes: list[int] = []

        def finish(server: ForkServer, pid: int, job: Job) -> None:
            code = server.wait(pid, job.timeout)
            if code is None:
                os.kill(pid, signal.SIGKILL)
                server.wait(pid, 10)
                raise AssertionError(f"`opledger {' '.join(job.args)}` ran past {job.timeout} s")
            codes.append(code)

        for i, job in enumerate(jobs):
            Path(tmp, f"{i}.in").write_text(job.stdin)
            server = fork_server(job.env)
            pid = server.start(
                job.args,
                job.env,
                job.cwd or Path(tmp),
                Path(tmp, f"{i}.in"),
                Path(tmp, f"{i}.out"),
                Path(tmp, f"{i}.err"),
            )
            started.append((server, pid))
            if not together:
                finish(server, pid, job)
        if together:
            for (server, pid), job in zip(started, jobs, strict=True):
                finish(server, pid, job)
        return [
            subprocess.CompletedProcess(
                list(job.args),
                code,
                Path(tmp, f"{i}.out").read_text(),
                Path(tmp, f"{i}.err").read_text(),
            )
            for i, (job, code) in enumerate(zip(jobs, codes, strict=True))
        ]


def cli_forked(*calls: tuple[str, ...], **extra: str) -> list[Run]:
    """`tests.clirun.cli(database_url, *args, **extra)` for each (database_url, *args) of
    `calls`: processes of their own side by side, forked from a server that imported the
    command once; their output piped, 80 columns, `cli`'s environment."""

    def env(database_url: str) -> dict[str, str]:
        own = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
        ledger = {"OPLEDGER_DATABASE_URL": database_url, SCHEMA_VARIABLE: SCHEMA}
        return own | ledger | {"COLUMNS": "80"} | extra

    jobs = (Job(args, env(url)) for url, *args in calls)
    done = opledger_forked(*jobs, together=True)
    return [Run(d.returncode, d.stdout, d.stderr) for d in done]


_accounts: dict[tuple[str, str], Accounts] = {}


def add_operator(env: dict[str, str], name: str, *args: str, password: str = PASSWORD) -> None:
    """What `opledger operator add NAME ARGS --by test` with `password` on stdin does (ARGS:
    --tenant T, --all-tenants, --sso-only, --approves PATTERN), through the library call it
    makes, in this process: `Accounts(engine).add(...)`, its hash the same argon2 one. (The
    command itself is run by tests/integration/test_console_access.py.)"""
    from opledger.ledger import Ledger

    tenants: list[str] = []
    approves: list[str] = []
    all_tenants = sso_only = False
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--tenant":
            tenants.append(rest.pop(0))
        elif arg == "--all-tenants":
            all_tenants = True
        elif arg == "--sso-only":
            sso_only = True
        elif arg == "--approves":
            approves.append(rest.pop(0))
        else:
            raise ValueError(f"add_operator: {arg!r} is not an option it knows")
    url = env["OPLEDGER_DATABASE_URL"]
    schema = env.get(SCHEMA_VARIABLE, "opledger")
    accounts = _accounts.get((url, schema))
    if accounts is None:
        from opledger.console.accounts import Accounts

        ledger = Ledger.from_url(url, schema=schema, pool_size=1)
        accounts = _accounts[(url, schema)] = Accounts(ledger.engine)
    try:
        accounts.add(
            name,
            tenants=tenants,
            all_tenants=all_tenants,
            password=None if sso_only else password,
            by="test",
            approves=approves,
        )
    finally:
        accounts.engine.dispose()  # no connection of it left open between tests


def forget_accounts(database_url: str) -> None:
    """No operator, session nor sign-in attempt left in the test database (what each test's
    `env` starts from)."""
    with connect_ledger(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE operators, signin_attempts CASCADE")


@contextmanager
def running_console(
    env: dict[str, str], log: Path, *args: str, forked: bool = False
) -> Iterator[str]:
    """`opledger console ARGS` on a free port, once it answers; yields its base URL and
    stops it on exit. `forked`: forked from the `fork_server` (a process of its own all the
    same, without a second or two of imports)."""
    port = free_port()
    argv = ["console", "--port", str(port), *args]
    url = f"http://127.0.0.1:{port}"
    proc = (ForkedProc if forked else Proc)("console", argv, env, log)

    def up(client: httpx.Client) -> bool:
        if proc.proc.poll() is not None:
            raise AssertionError(f"the console died:\n{proc.output()}")
        if not listening(port):  # a socket, not a request each time: it costs next to nothing
            return False
        try:
            return client.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        with httpx.Client(base_url=url, timeout=1) as health:
            wait_until(lambda: up(health), 30, "the console to answer", every=0.05)
        yield url
    finally:
        proc.stop()


@contextmanager
def page_client(url: str) -> Iterator[httpx.Client]:
    """A client of the console at `url` (no cookie yet) that says it comes from the
    console's own pages (`Origin`), as a browser posting one of its forms does."""
    with httpx.Client(
        base_url=url, follow_redirects=False, timeout=30, headers={"Origin": url}
    ) as client:
        yield client


@contextmanager
def console_client(
    env: dict[str, str], log: Path, *args: str, forked: bool = False
) -> Iterator[httpx.Client]:
    """A running console (`running_console`) and a `page_client` of it."""
    with running_console(env, log, *args, forked=forked) as url, page_client(url) as client:
        yield client


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def sign_in(client: httpx.Client, name: str, password: str = PASSWORD) -> httpx.Response:
    """The sign-in form, fetched and posted as a browser does."""
    nonce = csrf_of(client.get("/login"))
    return client.post("/login", data={"csrf_token": nonce, "name": name, "password": password})


def browser_sign_in(driver: WebDriver, url: str, name: str, password: str = PASSWORD) -> None:
    """Sign `driver` in to the console at `url` as `name`, from no session (its cookies
    deleted), through the sign-in form the console redirects to."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(url + "/")
    assert "/login" in driver.current_url
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "sign-in").click()
    assert driver.find_element(By.ID, "operator-name").text == name


@contextmanager
def chromium(profile: Path) -> Iterator[WebDriver]:
    """Debian's Chromium, headless, through the system chromedriver (never Selenium
    Manager: nothing is downloaded at test time); skipped (failed on CI) without them."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("CI"):
            raise AssertionError("chromium and chromium-driver are missing (.ci/run installs them)")
        pytest.skip("no chromium/chromium-driver: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    # a click that submits a form returns before the next page loads: every lookup waits
    # (up to 10 s) for an element of the page it expects, never one of the page before
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
