"""Sign-in CSRF in a real browser (Debian's Chromium): a page on another port of the same
host plants the console's sign-in nonce cookie (cookies ignore ports) and posts the
sign-in form to the console with the attacker's name and password. Were it accepted, the
victim's browser would be signed in as the attacker, and whatever they did would be
recorded in the attacker's name. A real `opledger console` process; the attacker's page
is served by a plain HTTP server on another port of 127.0.0.1."""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from opledger.dev.processes import unconfigured_environ
from tests.conftest import connect_ledger
from tests.consoles import PASSWORD, add_operator, chromium, csrf_of, running_console

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.system


class Attacker:
    """An HTTP server on another port of 127.0.0.1: `/plant?nonce=N` sets the console's
    nonce cookie to N and posts the console's sign-in form as mallory, by itself."""

    def __init__(self, console_url: str) -> None:
        target = console_url

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                nonce = self.path.partition("nonce=")[2] or "planted"
                fields = {"csrf_token": nonce, "name": "mallory", "password": PASSWORD}
                inputs = "".join(
                    f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
                    for k, v in fields.items()
                )
                body = (
                    f'<form id="f" method="post" action="{target}/login">{inputs}</form>'
                    "<script>document.getElementById('f').submit()</script>"
                ).encode()
                self.send_response(200)
                self.send_header("Set-Cookie", f"opledger_login={nonce}; Path=/")
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Attacker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def test_a_page_on_another_port_cannot_sign_the_browser_in_as_someone_else(
    browser: WebDriver, database_url: str, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with connect_ledger(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE operators, signin_attempts CASCADE")
    env = unconfigured_environ() | {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_STATE_DIR": str(tmp_path),
    }
    add_operator(env, "mallory", "--tenant", "acme")
    with running_console(env, tmp_path / "c.log") as url, Attacker(url) as attacker:
        # a nonce the attacker made up, and one the console really issued (to the attacker)
        issued = csrf_of(httpx.get(f"{url}/login"))
        for nonce in ("planted", issued):
            browser.delete_all_cookies()
            browser.get(f"{attacker.url}/plant?nonce={nonce}")
            assert browser.find_element(By.ID, "refusal-title").text == "refused", nonce
            browser.get(url + "/")
            assert "/login" in browser.current_url, nonce  # not signed in as anybody
            assert not browser.find_elements(By.ID, "operator-name")
        with connect_ledger(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM console_sessions").fetchone()
        assert row == (0,)
