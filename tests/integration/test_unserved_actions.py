"""Open operations whose action no adapter serves are visible on each scrape: the
`opledger_operations_unserved{action}` gauge, read from the rows `opledger_operations`
reads, against the adapters the metrics process is configured with."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Collection, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from opledger.ledger import Ledger
from opledger.observability.server import Served, make_server
from tests.intents import prepare

AUTH = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}
UNSERVED = "opledger_operations_unserved"

Scrape = Callable[..., dict[str, float]]


@pytest.fixture
def scrape(ledger: Ledger) -> Iterator[Scrape]:
    servers = []

    def get(actions: Collection[str] | Served | None = Served.CONFIGURED) -> dict[str, float]:
        server = make_server(ledger.engine, user="prom", password="s3cret", port=0, actions=actions)
        servers.append(server)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        body = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", headers=AUTH).text
        return {
            s.labels.get("action", ""): s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == UNSERVED
        }

    yield get
    for server in servers:
        server.shutdown()
        server.server_close()


def test_open_operations_of_actions_no_adapter_serves_are_counted_by_action(
    ledger: Ledger, scrape: Scrape
) -> None:
    assert scrape() == {"": 0}  # a zero series, so an alert sees the count fall
    bare = Ledger(ledger.engine)  # no registry: any well-formed action is accepted
    bare.grant(tenant="acme", scope=["*"], granted_by="test", ref="auth_acme")
    typo = prepare(bare, "t1", action="crm.close_cse.v1")
    prepare(bare, "t2", action="crm.close_cse.v1")
    prepare(bare, "t3", action="billing.refund.v1")
    prepare(bare, "served")  # crm.close_case.v1: the bundled CRM adapter serves it
    # the default: the adapters OPLEDGER_ADAPTERS configures (the bundled ones here)
    assert scrape() == {"crm.close_cse.v1": 2, "billing.refund.v1": 1}
    # an open operation in any open status counts; a finished one does not
    claim = bare.claim(typo, owner="t")
    assert claim is not None
    assert scrape() == {"crm.close_cse.v1": 2, "billing.refund.v1": 1}
    bare.cancel(prepare(bare, "t3", action="billing.refund.v1"), actor="t", reason="typo")
    assert scrape() == {"crm.close_cse.v1": 2}
    # what counts as served is the process's adapters; none given: no such gauge
    assert scrape(["crm.close_cse.v1", "crm.close_case.v1"]) == {"": 0}
    assert scrape(None) == {}
