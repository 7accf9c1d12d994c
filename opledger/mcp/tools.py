"""The gateway's tools: one per action the configured adapters serve, and the status tool.

A tool's input is the act: its `target`, its `payload` (the action's payload schema, from
its adapter) and, only for an act done again on purpose, `repeat`. Its description says
which payload fields make another act (the action's intent fields): asked again with the
same ones, the tool answers with the recorded operation instead of acting again.

A tool is named after its action in the words model APIs accept for a function
(`^[a-zA-Z0-9_-]{1,64}$`, OpenAI's and Anthropic's alike: hosts pass MCP tool names to the
model as they are): `crm.close_case.v1` is offered as `crm_close_case_v1` (`tool_name`),
and the action itself is in the tool's title, description and `_meta["opledger/action"]`.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from opledger.adapters.registry import Registry
from opledger.agents.answers import REPEAT, REPEAT_HELP
from opledger.ledger import InvalidInput
from opledger.ledger.ids import MAX_IDENTIFIER_LENGTH
from opledger.ledger.intents import TENANT

#: the tool that tells how an earlier call's operation stands (and waits for it)
STATUS_TOOL = "opledger_status"
#: the names 0.1.0 offered (the action itself, and this for the status tool): still served
#: when a call names them, never listed
LEGACY_STATUS_TOOL = "opledger.status"
#: the `_meta` entry of an action's tool that names the action
ACTION_META = "opledger/action"
#: a function name as the model APIs accept it (OpenAI's; Anthropic's is the same)
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOL_NAME = 64
#: how many hex digits of the action's sha256 end a name shortened to fit
_HASH_DIGITS = 8
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


class ToolNameClash(InvalidInput):
    """Two actions would be offered under one tool name (`crm.a_b.v1` and `crm_a.b.v1` are
    both `crm_a_b_v1`): the gateway refuses to start, naming both (`actions`) and the name
    (`tool`), rather than have one tool stand for two acts."""

    actions: tuple[str, str]
    tool: str


def tool_name(action: str) -> str:
    """The tool an action is offered as: its name with each `.` as `_` (an action's name has
    only lower-case letters, digits, `_` and `.`), shortened to 64 characters when longer —
    its first 55 characters, `_` and 8 hex digits of the action's sha256 — so the same action
    is always the same tool, on every replica and after every restart, and two long actions
    that share their first 55 characters are two tools."""
    name = action.replace(".", "_")
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(action.encode()).hexdigest()[:_HASH_DIGITS]
    return f"{name[: MAX_TOOL_NAME - _HASH_DIGITS - 1]}_{digest}"


def tool_names(actions: Iterable[str]) -> dict[str, str]:
    """tool name -> action for `actions`, or `ToolNameClash` naming two actions that would
    be one tool (or an action that would be the status tool)."""
    named: dict[str, str] = {}
    for action in actions:
        name = tool_name(action)
        if not TOOL_NAME_RE.fullmatch(name):  # an action that is not a versioned name
            raise InvalidInput(f"{action!r} cannot be named as a tool", field="action")
        taken = named.get(name, STATUS_TOOL if name == STATUS_TOOL else None)
        if taken is not None:
            raise ToolNameClash(
                f"the actions {taken} and {action} would both be the MCP tool {name}: "
                "rename one (a new version of the action) or leave one out",
                actions=(taken, action),
                tool=name,
            )
        named[name] = action
    return named


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


def with_run_argument(
    schema: Mapping[str, Any], *, required: bool, max_length: int = MAX_IDENTIFIER_LENGTH
) -> dict[str, Any]:
    """`schema` with the `run` argument a client of the `argument` run mode sets (required
    in what tools/list shows; optional in what a call is checked against, since a call whose
    `_meta` names its run needs none), at most `max_length` characters (what fits the
    caller's runs: `Caller.max_run_length`)."""
    out = copy.deepcopy(dict(schema))
    props = out.setdefault("properties", {})
    if RUN_ARGUMENT in props:
        raise ValueError(f"the schema already has an argument named {RUN_ARGUMENT!r}")
    props[RUN_ARGUMENT] = {
        "type": "string",
        "minLength": 1,
        "maxLength": max_length,
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
        f"{registry.description(action)} (Action {action}.) Done at most once per act "
        f"{where}: an act is {act}; calling again for the same act answers how the first "
        "call's act stands and does nothing new. The answer's kind is confirmed, rejected, "
        "cancelled, unknown (it may have happened: never do it another way) or pending (ask "
        f"{STATUS_TOOL})."
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
