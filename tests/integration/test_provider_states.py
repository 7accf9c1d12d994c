"""What people see of a provider's pressure: the metrics, `opledger providers`, `opledger
ops list` and the console's queue, each read from the real ledger with providers put into
every state through the ledger's own API (refused connections, a "not now", slots held
and operations deferred for room).

The providers of the test actions are their first segment: crm's breaker is open, email
asked to wait, sms is at its concurrency limit with operations waiting, chat refused one
connection (below its breaker's count: still ok).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from sqlalchemy import event, text

from opledger.ledger import Ambiguous, Claim, ClaimTerms, Ledger, ProviderBusy
from opledger.ledger.contract import Limits
from opledger.ledger.evidence import NO_CONNECTION, NOT_SENT, THROTTLED
from opledger.ledger.providers import ProviderState
from opledger.ledger.queries.providers import PROVIDERS
from opledger.ledger.sensitive import scrub_text
from opledger.observability.server import registry_for
from tests.clirun import Run, cli
from tests.consoles import add_operator, console_client, sign_in
from tests.intents import prepare
from tests.leaks import SHAPES
from tests.prom import samples

#: a breaker that stays open for the whole test once open (its first probe is far off)
BREAKER = Limits(breaker_after=3, probe_every=timedelta(minutes=5))
#: a secret's shape a provider's error quoted: hidden wherever the reason is shown
QUOTED = SHAPES["b"]


def take(ledger: Ledger, op_id: str, terms: ClaimTerms | None = None) -> Claim:
    claim = ledger.claim(op_id, owner="w", terms=terms or ClaimTerms())
    assert claim is not None
    return claim


def open_breaker(ledger: Ledger, action: str = "crm.close_case.v1") -> None:
    """Three refused connections in a row: the provider's breaker opens."""
    for n in range(3):
        claim = take(ledger, prepare(ledger, f"refused-{n}", action=action))
        refused = Ambiguous(
            code=NOT_SENT,
            reason=f"connection refused ({QUOTED})",
            detail={"why": NO_CONNECTION},
        )
        ledger.record_outcome(claim, refused, limits=BREAKER)


def refuse_once(ledger: Ledger, action: str = "chat.post.v1") -> None:
    """One refused connection: counted, the breaker stays closed."""
    claim = take(ledger, prepare(ledger, "refused-once", action=action))
    refused = Ambiguous(code=NOT_SENT, reason="no route", detail={"why": NO_CONNECTION})
    ledger.record_outcome(claim, refused, limits=BREAKER)


def throttle(ledger: Ledger, action: str = "email.send.v1", wait_s: float = 300) -> None:
    """A 429 asking for `wait_s`: nothing is claimed for the provider until then."""
    claim = take(ledger, prepare(ledger, "throttled", action=action))
    said = Ambiguous(
        code=THROTTLED, reason="HTTP 429", detail={"status": 429, "retry_after_s": wait_s}
    )
    ledger.record_outcome(claim, said, limits=Limits())


def fill_and_wait(ledger: Ledger, action: str = "sms.send.v1") -> list[str]:
    """Two calls hold both of the provider's slots; three more are refused a claim and
    deferred for a minute, as the dispatch step leaves them. Returns the deferred ones."""
    terms = ClaimTerms(
        lease=timedelta(seconds=60),
        limits_by_provider={"sms": Limits(concurrency=2).claim_form()},
    )
    for n in range(2):
        take(ledger, prepare(ledger, f"sent-{n}", action=action), terms)
    waiting = [prepare(ledger, f"waits-{n}", action=action) for n in range(3)]
    until = datetime.now(UTC) + timedelta(minutes=1)
    for op_id in waiting:
        with pytest.raises(ProviderBusy):
            ledger.claim(op_id, owner="w", terms=terms)
        assert ledger.defer(op_id, until=until)
    return waiting


@dataclass
class Pressed:
    """The ledger with every state in it, and the deferred operations."""

    ledger: Ledger
    waiting: list[str]

    def state(self, provider: str) -> ProviderState:
        return next(p for p in self.ledger.providers() if p.provider == provider)


@pytest.fixture
def grant(ledger: Ledger) -> str:
    """Every test action's provider, for tenant acme."""
    return ledger.grant(
        tenant="acme",
        scope=["crm.*", "email.*", "sms.*", "chat.*"],
        granted_by="test",
        ref="auth_acme",
    ).ref


@pytest.fixture
def pressed(ledger: Ledger, grant: str) -> Pressed:
    open_breaker(ledger)
    throttle(ledger)
    waiting = fill_and_wait(ledger)
    refuse_once(ledger)
    return Pressed(ledger, waiting)


def scrape(ledger: Ledger) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The ledger's gauges, as `opledger metrics` serves them."""
    return samples(generate_latest(registry_for(ledger.engine)).decode())


def by_provider(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    return {dict(labels)["provider"]: v for (n, labels), v in got.items() if n == name}


# -- metrics -------------------------------------------------------------------------------


def test_the_gauges_say_which_provider_is_paused_and_why_operations_wait(
    pressed: Pressed,
) -> None:
    got = scrape(pressed.ledger)
    assert by_provider(got, "opledger_provider_paused") == {
        "chat": 0,
        "crm": 1,
        "email": 1,
        "sms": 0,
    }
    assert by_provider(got, "opledger_provider_breaker_open") == {
        "chat": 0,
        "crm": 1,
        "email": 0,
        "sms": 0,
    }
    assert by_provider(got, "opledger_provider_refusals") == {
        "chat": 1,
        "crm": 3,
        "email": 0,
        "sms": 0,
    }
    assert by_provider(got, "opledger_provider_in_flight") == {
        "chat": 0,
        "crm": 0,
        "email": 0,
        "sms": 2,
    }
    assert by_provider(got, "opledger_operations_waiting_capacity") == {
        "chat": 0,
        "crm": 0,
        "email": 0,
        "sms": 3,
    }
    since = by_provider(got, "opledger_provider_paused_since_seconds")
    for provider in ("crm", "email"):
        began = pressed.state(provider).paused_since
        assert began is not None and since[provider] == pytest.approx(began.timestamp())
    assert since["chat"] == since["sms"] == 0


def test_a_ledger_with_no_pressure_has_one_zero_series_per_gauge(ledger: Ledger) -> None:
    got = scrape(ledger)
    for name in ("opledger_provider_paused", "opledger_operations_waiting_capacity"):
        assert by_provider(got, name) == {"": 0}


def test_a_pause_that_ended_is_no_longer_a_pause(ledger: Ledger, grant: str) -> None:
    throttle(ledger, wait_s=0.2)
    assert by_provider(scrape(ledger), "opledger_provider_paused") == {"email": 1}
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while by_provider(scrape(ledger), "opledger_provider_paused") != {"email": 0}:
        assert datetime.now(UTC) < deadline, "the pause did not end"
    assert by_provider(scrape(ledger), "opledger_provider_paused_since_seconds") == {"email": 0}


def test_the_providers_add_one_statement_to_a_scrape_however_many_there_are(
    ledger: Ledger, grant: str
) -> None:
    def statements() -> int:
        ran: list[str] = []

        def count(*args: object) -> None:
            ran.append(str(args[2]))

        event.listen(ledger.engine, "before_cursor_execute", count)
        try:
            scrape(ledger)
        finally:
            event.remove(ledger.engine, "before_cursor_execute", count)
        return len(ran)

    none = statements()
    open_breaker(ledger)
    fill_and_wait(ledger)
    throttle(ledger)
    assert statements() == none


def test_the_waiting_operations_are_read_from_the_waiting_room_index(ledger: Ledger) -> None:
    with ledger.engine.connect() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(conn.execute(text(f"EXPLAIN {PROVIDERS}")).scalars())
    assert "ix_operations_waiting_room" in plan, plan  # deferred ones only (0019)


# -- the command ---------------------------------------------------------------------------


def rows(out: str) -> dict[str, list[str]]:
    """A table piped wide enough for one line a row: its cells by the row's first cell
    (cells are two or more spaces apart)."""
    lines = [line for line in out.splitlines() if line.strip()]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines)}


def test_opledger_providers_names_each_state_and_its_reason(
    pressed: Pressed, database_url: str, invoke: Callable[..., Run]
) -> None:
    table = cli(database_url, "providers", COLUMNS="200")
    document = invoke("providers", "--json")
    assert table.code == 0, table.err
    shown = rows(table.out)
    assert shown["provider"] == ["state", "refusals", "in flight", "waiting"]
    crm, email = pressed.state("crm"), pressed.state("email")
    assert crm.paused_since is not None and email.paused_until is not None
    since = crm.paused_since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    until = email.paused_until.astimezone(UTC).strftime("%H:%M:%S")
    assert crm.pause_reason is not None and QUOTED in crm.pause_reason
    why = scrub_text(crm.pause_reason)
    assert why.startswith("refusing connections (connection refused ([hidden")
    assert shown["crm"] == [f"breaker open since {since}: {why}", "3", "0", "0"], table.out
    assert shown["email"] == [
        f"paused until {until}: the provider asked to wait 300 s (HTTP 429)",
        "0",
        "0",
        "0",
    ]
    assert shown["sms"] == ["ok", "0", "2", "3"]
    assert shown["chat"] == ["ok", "1", "0", "0"]
    assert QUOTED not in table.out

    assert document.code == 0, document.err
    records = {r["provider"]: r for r in document.json()}
    assert sorted(records) == ["chat", "crm", "email", "sms"]
    assert records["crm"]["breaker"] == "open" and records["crm"]["paused"] is True
    assert records["email"]["paused"] is True and records["email"]["breaker"] == "closed"
    assert (records["sms"]["in_flight"], records["sms"]["waiting"]) == (2, 3)
    assert records["sms"]["paused"] is False and records["chat"]["failures"] == 1
    assert QUOTED not in document.out and "[hidden" in records["crm"]["pause_reason"]


def test_opledger_providers_says_when_nothing_is_under_pressure(
    ledger: Ledger, invoke: Callable[..., Run]
) -> None:
    said = invoke("providers")
    assert said.code == 0, said.err
    assert said.out == "no provider has pushed back, holds a slot or has operations waiting\n"
    assert invoke("providers", "--json").json() == []


def test_opledger_providers_reset_forgets_a_breaker_no_call_reaches(
    ledger: Ledger, grant: str, invoke: Callable[..., Run]
) -> None:
    held = take(  # a call in flight, holding the one slot
        ledger,
        prepare(ledger, "in-flight", action="crm.close_case.v1"),
        ClaimTerms(limits_by_provider={"crm": {"concurrency": 1}}),
    )
    open_breaker(ledger)  # its waiting operations were all cancelled: no probe will come
    with pytest.raises(ProviderBusy, match="refusing connections"):
        ledger.claim(prepare(ledger, "next"), owner="w", terms=ClaimTerms())
    said = invoke("providers", "reset", "crm", "--operator", "alice")
    assert said.code == 0, said.err
    assert said.out.startswith("reset: crm's pause, breaker and refusals forgotten, by alice (")
    states = {p.provider: p for p in ledger.providers()}
    assert states["crm"].breaker == "closed" and not states["crm"].paused
    assert states["crm"].failures == 0 and states["crm"].in_flight == 1  # its call still holds
    limited = ClaimTerms(limits_by_provider={"crm": {"concurrency": 1}})
    with pytest.raises(ProviderBusy, match="calls in flight"):  # the held slot was kept
        ledger.claim(prepare(ledger, "over"), owner="w", terms=limited)
    take(ledger, prepare(ledger, "after"))  # unlimited: claimed at once
    ledger.record_outcome(held, Ambiguous(code=NOT_SENT, reason="x"), limits=BREAKER)
    again = invoke("providers", "reset", "crm")
    assert again.code == 0 and "forgotten" in again.out, again.err  # the free slot's row
    nothing = invoke("providers", "reset", "crm")
    assert nothing.code == 0 and nothing.out == "crm: nothing to forget\n"
    assert invoke("providers", "reset", "").code != 0


def test_ops_list_says_which_operations_wait_for_their_provider(
    pressed: Pressed, invoke: Callable[..., Run]
) -> None:
    plain = prepare(pressed.ledger, "plain", action="sms.send.v1")  # not deferred
    listed = invoke("ops", "list", "--json")
    table = invoke("ops", "list")
    assert listed.code == 0 and table.code == 0, (listed.err, table.err)
    waits = {op["id"]: op["waits_until"] for op in listed.json()}
    assert {i for i, until in waits.items() if until} == set(pressed.waiting)
    statuses = [
        line.removeprefix("status").strip()
        for line in table.out.splitlines()
        if line.startswith("status ")
    ]
    expected = []
    for op_id in pressed.waiting:
        until = pressed.ledger.get(op_id).next_check_at
        assert until is not None and waits[op_id] is not None
        assert datetime.fromisoformat(waits[op_id]) == until
        expected.append(f"prepared, waits for sms until {until.astimezone(UTC):%H:%M:%S}")
    assert sorted(s for s in statuses if "waits" in s) == sorted(expected), table.out
    # one merely prepared, one the claim took, one whose outcome is unknown (its check
    # scheduled): none waits for its provider
    assert waits[plain] is None
    assert {"prepared", "dispatching", "unknown"} <= set(statuses), table.out


# -- the console ---------------------------------------------------------------------------


def provider_rows(page: str) -> dict[str, list[str]]:
    """The queue's providers section: each row's cells (markup removed, unescaped)."""
    found = re.search(r'<section id="providers">(.*?)</section>', page, re.S)
    if found is None:
        return {}
    cells = {}
    for row in re.findall(r'<tr class="provider-row".*?</tr>', found.group(1), re.S):
        texts = [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td>(.*?)</td>", row, re.S)
        ]
        cells[texts[0]] = texts[1:]
    return cells


def test_the_queue_names_paused_providers_and_counts_waiting_only_for_every_tenant(
    pressed: Pressed, env: dict[str, str], tmp_path: Path
) -> None:
    add_operator(env, "root", "--all-tenants")
    add_operator(env, "alice", "--tenant", "acme")
    crm, email = pressed.state("crm"), pressed.state("email")
    with console_client(env, tmp_path / "c.log") as client:
        assert sign_in(client, "root").status_code == 303
        everyone = client.get("/")
        assert everyone.status_code == 200, everyone.text
        shown = provider_rows(everyone.text)
        assert sorted(shown) == ["crm", "email", "sms"]  # chat is under no pressure
        state, since, until, why, waiting = shown["crm"]
        assert state == "breaker open" and waiting == "0"
        assert since.startswith(str(crm.paused_since)[:19].replace("T", " "))
        assert crm.pause_reason is not None and why == scrub_text(crm.pause_reason)
        state, since, until, why, waiting = shown["email"]
        assert (state, waiting) == ("paused", "0")
        assert until == str(email.paused_until)[:19].replace("T", " ")
        assert why == "the provider asked to wait 300 s (HTTP 429)"
        assert shown["sms"] == ["waiting for room", "", "", "", "3"]
        assert QUOTED not in everyone.text

        client.cookies.clear()
        assert sign_in(client, "alice").status_code == 303
        scoped = provider_rows(client.get("/").text)
        assert sorted(scoped) == ["crm", "email"]  # fleet-wide counts are every tenant's
        assert all(len(cells) == 4 for cells in scoped.values()), scoped


def test_the_queue_has_no_providers_section_when_none_is_under_pressure(
    ledger: Ledger, grant: str, env: dict[str, str], tmp_path: Path
) -> None:
    refuse_once(ledger)
    add_operator(env, "root", "--all-tenants")
    with console_client(env, tmp_path / "c.log") as client:
        assert sign_in(client, "root").status_code == 303
        page = client.get("/")
        assert page.status_code == 200 and "Review queue" in page.text
        assert 'id="providers"' not in page.text
