"""The DBOS side of `opledger bench --agents`: the same effect as a DBOS Transact workflow
with one step, checkpointed in a Postgres system database of its own.

Imported only when the agents bench runs (`dbos` is in the `bench` extra). DBOS is
configured as shipped — a name and the system database's URL, its default pool, no
asynchronous commit — launched once per run and destroyed at its end.
"""

from __future__ import annotations

from typing import Any

from dbos import DBOS, SetWorkflowID

#: the application name DBOS records its workflows under
APP_NAME = "opledger-bench-agents"


def instant_provider(key: str) -> dict[str, Any]:
    """The provider the step calls: a receipt for the key at once, no network (what the
    bench's `InstantAdapter.dispatch` answers opledger's worker)."""
    return {"receipt_id": key, "binding": {"idempotency_key": key}}


@DBOS.step()
def call_provider(key: str) -> dict[str, Any]:
    return instant_provider(key)


@DBOS.workflow()
def one_effect(key: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One effect: a workflow whose only step calls the provider."""
    return call_provider(key)


class DbosSide:
    """DBOS launched on `system_database_url` (an empty database: DBOS makes its schema on
    launch) until `close()`."""

    def __init__(self, system_database_url: str) -> None:
        # as shipped but for its log, which would say at INFO that it launched and stopped
        DBOS(
            config={
                "name": APP_NAME,
                "system_database_url": system_database_url,
                "log_level": "WARNING",
            }
        )
        try:
            DBOS.launch()
        except BaseException:
            DBOS.destroy()
            raise

    def effect(self, workflow_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Run the effect's workflow in this thread under `workflow_id` (the same id again
        returns the recorded result: nothing is called twice)."""
        with SetWorkflowID(workflow_id):
            result: dict[str, Any] = one_effect(workflow_id, payload)
        return result

    def close(self) -> None:
        DBOS.destroy()
