"""The outbox never fails the caller's commit when the broker is down: the operation is
committed, the failed publish is logged, and the relay publishes it later."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from opledger.ledger import Ledger, Status

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from sqlalchemy import text
    from sqlalchemy.orm import Session
    from opledger.ledger import Ledger
    from opledger.tasks.outbox import prepare_and_dispatch

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    ledger = Ledger.from_url(sys.argv[1])
    intent = dict(tenant="acme", workflow_id="wf-outbox", action="crm.close_case.v1",
                  target="case-318", payload={"note": "resolved"}, authorization_ref=sys.argv[2])
    with Session(ledger.engine) as session:
        session.execute(text("SELECT 1"))
        op = prepare_and_dispatch(ledger, session=session, intent_key="in-tx", **intent)
        session.commit()
    direct = prepare_and_dispatch(ledger, intent_key="direct", **intent)
    print(op.id, direct.id)
    """
)


def test_a_broker_outage_never_fails_the_callers_commit(
    ledger: Ledger, grant: str, database_url: str
) -> None:
    env = {
        **os.environ,
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_BROKER_URL": "redis://127.0.0.1:1/0",  # nothing listens there
    }
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, database_url, grant],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    in_tx, direct = run.stdout.split()
    for op_id in (in_tx, direct):
        assert ledger.get(op_id).status is Status.PREPARED  # committed; the relay sends it
        assert f"{op_id} is prepared but its dispatch message could not be published" in (
            run.stderr
        )


PUBLISH = textwrap.dedent(
    """
    import sys
    from opledger.ledger import Ledger
    from opledger.tasks.app import publish_dispatch

    ledger = Ledger.from_url(sys.argv[1])
    op = ledger.prepare(tenant="acme", workflow_id="wf-publish", intent_key="close",
                        action="crm.close_case.v1", target="case-318",
                        payload={"note": "resolved"}, authorization_ref=sys.argv[2])
    print(op.id, flush=True)
    publish_dispatch(op.id)   # the broker is down: raised, not swallowed
    """
)


def test_publishing_to_a_broker_that_is_down_raises_one_short_error(
    ledger: Ledger, grant: str, database_url: str
) -> None:
    """Published by hand (`publish_dispatch`, as docs/celery.md shows): the caller learns the
    broker is down in one line that says the operation is recorded and sent later, not in
    a hundred lines of the transport's frames."""
    env = {
        **os.environ,
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_BROKER_URL": "redis://:hunter2@127.0.0.1:1/0",  # nothing listens there
    }
    run = subprocess.run(
        [sys.executable, "-c", PUBLISH, database_url, grant],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 1
    op_id = run.stdout.strip()
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("opledger.tasks.app.BrokerUnavailable: the broker did not take"), last
    assert op_id in last and "the operation is recorded" in last and "relay" in last
    assert len(run.stderr.splitlines()) < 25, run.stderr
    assert "hunter2" not in run.stderr
    assert ledger.get(op_id).status is Status.PREPARED  # recorded: the relay sends it
