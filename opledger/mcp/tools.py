"""The gateway's tools: one per action the configured adapters serve, and the status tool.

A tool's input is the act: its `target`, its `payload` (the action's payload schema, from
its adapter) and, only for an act done again on purpose, `repeat`. Its description says
which payload fields make another act (the action's intent fields): asked again with the
same ones, the tool answers with the recorded operation instead of acting again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from opledger.adapters.registry import Registry
from opledger.agents.answers import REPEAT, REPEAT_HELP
from opledger.ledger.ids import MAX_IDENTIFIER_LENGTH
from opledger.ledger.intents import TENANT

#: the tool that tells how an earlier call's operation stands (and waits for it)
STATUS_TOOL = "opledger.status"
#: the `_meta` entry of a call that names the caller's run
RUN_META = "opledger/run"
#: the argument that names the run, for a client whose run mode is `argument`
RUN_ARGUMENT = "run"
RUN_HELP = (
    "Your run's id: the conversation's, job's or task's id, the same on every retry, "
    "restart and re-issue of this call (a new id is a new run: its acts are done again)."
)
#: the longest a status call may wait, in seconds: well under a host's request timeout (the
#: TypeScript SDK's is 60 s) and a proxy's read timeout (nginx's is 60 s), since the answer
#: is one JSON body held open until then
MAX_STATUS_WAIT = 30.0


def input_schema(registry: Registry, action: str) -> dict[str, Any]:
    """The JSON Schema of a call of `action`'s tool."""
    return {
        "type": "object",
        "properties": {
            "target": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_IDENTIFIER_LENGTH,
                "description": "What the act is done to (see the tool's description).",
            },
            "payload": registry.payload_schema(action),
            REPEAT: {"type": "integer", "minimum": 1, "maximum": 1000, "description": REPEAT_HELP},
        },
        "required": ["target", "payload"],
        "additionalProperties": False,
    }


def with_run_argument(schema: Mapping[str, Any], *, required: bool) -> dict[str, Any]:
    """`schema` with the `run` argument a client of the `argument` run mode sets (required
    in what tools/list shows; optional in what a call is checked against, since a call whose
    `_meta` names its run needs none)."""
    out = copy.deepcopy(dict(schema))
    props = out.setdefault("properties", {})
    if RUN_ARGUMENT in props:
        raise ValueError(f"the schema already has an argument named {RUN_ARGUMENT!r}")
    props[RUN_ARGUMENT] = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_IDENTIFIER_LENGTH,
        "description": RUN_HELP,
    }
    if required:
        out["required"] = [*out.get("required", []), RUN_ARGUMENT]
    return out


def description(registry: Registry, action: str) -> str:
    """The action's description, what makes a call of it another act, and how wide an act
    is (the action's intent scope: one run, or every run of the tenant)."""
    fields = registry.intent_fields(action)
    act = (
        f"the target and the payload's {', '.join(fields)}"
        if fields
        else "the target alone (the rest of the payload is wording)"
    )
    where = (
        "whoever asks (any run or agent of your organisation)"
        if registry.intent_scope(action) == TENANT
        else "in your run"
    )
    return (
        f"{registry.description(action)} Done at most once per act {where}: an act is "
        f"{act}; calling again for the same act answers how the first call's act stands "
        "and does nothing new. The answer's kind is confirmed, rejected, cancelled, unknown "
        "(it may have happened: never do it another way) or pending (ask opledger.status)."
    )


STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op_id": {"type": "string", "description": "The op_id an earlier answer gave."},
        "wait": {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_STATUS_WAIT,
            "description": "Seconds to wait for it to settle (0: answer at once).",
        },
    },
    "required": ["op_id"],
    "additionalProperties": False,
}

STATUS_DESCRIPTION = (
    "How an operation an earlier call of yours started stands now (confirmed, rejected, "
    "cancelled, unknown or pending), waiting up to `wait` seconds for it to settle. Reads "
    "only; it never acts."
)
