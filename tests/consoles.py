"""Shared by the console's tests: the real `opledger` command, a running `opledger
console` process until it answers its health check, an HTTP client that speaks to it as
its own pages do, and Debian's Chromium driven through its chromedriver."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from opledger.dev.processes import Proc, free_port, wait_until

if TYPE_CHECKING:  # the browser tests import Selenium only once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

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


def add_operator(env: dict[str, str], name: str, *args: str, password: str = PASSWORD) -> None:
    """`opledger operator add NAME ARGS` with `password` on stdin; it must succeed."""
    done = opledger(
        env,
        "operator",
        "add",
        name,
        "--by",
        "test",
        *args,
        "--password-stdin",
        stdin=password + "\n",
    )
    assert done.returncode == 0, done.stderr


@contextmanager
def running_console(env: dict[str, str], log: Path, *args: str) -> Iterator[str]:
    """`opledger console ARGS` on a free port, once it answers; yields its base URL and
    stops it on exit."""
    port = free_port()
    proc = Proc("console", ["console", "--port", str(port), *args], env, log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.proc.poll() is not None:
            raise AssertionError(f"the console died:\n{proc.output()}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 30, "the console to answer")
        yield url
    finally:
        proc.stop()


@contextmanager
def console_client(env: dict[str, str], log: Path, *args: str) -> Iterator[httpx.Client]:
    """A running console and a client that says it comes from the console's own pages
    (`Origin`), as a browser posting one of its forms does."""
    with (
        running_console(env, log, *args) as url,
        httpx.Client(
            base_url=url, follow_redirects=False, timeout=30, headers={"Origin": url}
        ) as client,
    ):
        yield client


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def sign_in(client: httpx.Client, name: str, password: str = PASSWORD) -> httpx.Response:
    """The sign-in form, fetched and posted as a browser does."""
    nonce = csrf_of(client.get("/login"))
    return client.post("/login", data={"csrf_token": nonce, "name": name, "password": password})


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
