"""`opledger payloads`: the frozen payloads' encryption keys."""

from __future__ import annotations

from typing import Annotated

import typer

from opledger.settings import NotConfigured, get_settings

from .app import app, console, open_ledger

payloads_app = typer.Typer(help="Frozen payloads: re-encrypt them under the current key.")
app.add_typer(payloads_app, name="payloads")


@payloads_app.command("rotate")
def rotate(
    batch: Annotated[
        int, typer.Option(min=1, help="Rows re-encrypted per transaction (each one short).")
    ] = 500,
) -> None:
    """Re-encrypt every frozen payload not under the first key of OPLEDGER_PAYLOAD_KEYS
    (those under older keys, and those stored in clear), a batch per transaction. Safe
    while workers run, and to run again: remove an old key only once nothing remains."""
    if get_settings().payload_keys is None:
        raise NotConfigured(
            "OPLEDGER_PAYLOAD_KEYS is not set: list the new key first, then the old ones "
            "(key_id:base64,...)"
        )
    with open_ledger() as ledger:
        done = ledger.rotate_payloads(batch=batch)
    console.print(
        f"re-encrypted {done.resealed} payloads and result documents under key {done.key_id}; "
        f"{done.remaining} remain under another key or in clear",
        markup=False,
        highlight=False,
    )
    if done.remaining:
        console.print("some rows were held by another transaction: run it again", markup=False)
