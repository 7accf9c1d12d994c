"""What the three frameworks' effect tools share (`opledger.agents.tooling`), through each
framework as it calls them, on a real Postgres: arguments of common types (a date, a
Decimal, a UUID, an enum, a URL, a nested model) reach `effect_of` as JSON-ready values
and are recorded; a payload `effect_of` builds that the ledger cannot record is raised,
never answered to the model as a refusal it would ask again after; and after a
deliberate repeat the model is told the next repeat's number."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from pydantic import AnyUrl, BaseModel

from opledger.agents import Effects
from opledger.ledger import (
    Binding,
    Confirmed,
    Ledger,
    PayloadNotCanonicalizable,
    PayloadTooDeep,
    PayloadTooLarge,
)

FRAMEWORKS = ("langgraph", "pydantic_ai", "openai_agents")


class Level(Enum):
    HIGH = "high"


class Owner(BaseModel):
    name: str
    since: date


class FollowUp(BaseModel):
    case_id: str
    due: date
    at: datetime
    amount: Decimal
    ref: uuid.UUID
    level: Level
    link: AnyUrl
    owner: Owner


class SetStatus(BaseModel):
    case_id: str
    status: str


ARGS: dict[str, Any] = {
    "case_id": "case-318",
    "due": "2026-12-31",
    "at": "2026-12-04T10:30:00Z",
    "amount": "12.50",
    "ref": "0b9e4f8e-5c7a-4c1e-9d55-2b8a3f1e7c01",
    "level": "high",
    "link": "https://crm.acme.test/cases/318",
    "owner": {"name": "Ann", "since": "2025-01-02"},
}


class Published(list[str]):
    def __call__(self, op_id: str) -> None:
        self.append(op_id)


@pytest.fixture
def effects(ledger: Ledger, grant: str) -> Effects:
    """Effects over a ledger that knows the bundled CRM adapter's intent fields and payload
    schemas; dispatches go nowhere (no worker)."""
    from opledger.adapters.crm import CrmAdapter
    from opledger.adapters.registry import Registry

    registry = Registry([CrmAdapter("http://127.0.0.1:9", account="acme")])
    return Effects(Ledger(ledger.engine, actions=registry), publish=Published(), poll=30.0)


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # no exporter reaching out to OpenAI
    yield


def _caller(
    framework: str,
    effects: Effects,
    effect_of: Callable[..., Any],
    args_schema: type[BaseModel] = FollowUp,
) -> Any:
    """A function that calls the framework's effect tool (its arguments as the model gives
    them, JSON) and returns the answer the model reads as a dict; what the tool raises is
    raised."""
    tool_options: dict[str, Any] = {
        "name": "follow_up",
        "description": "Set a case's follow-up",
        "args_schema": args_schema,
        "tenant": "acme",
        "action": "crm.update_case.v1",
        "authorization_ref": "auth_acme",
        "effect_of": effect_of,
        "wait": None,
    }
    if framework == "langgraph":
        return _langgraph(effects, tool_options)
    if framework == "pydantic_ai":
        return _pydantic_ai(effects, tool_options)
    return _openai_agents(effects, tool_options)


def _langgraph(effects: Effects, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    from opledger.agents.langgraph import effect_tool

    tool = effect_tool(effects, **options)
    config = {"configurable": {"thread_id": "t-1"}}

    def call(**args: Any) -> dict[str, Any]:
        call = {"type": "tool_call", "id": f"call_{uuid.uuid4().hex[:8]}", "args": args}
        message = tool.invoke({**call, "name": "follow_up"}, config)  # type: ignore[arg-type]
        answer: dict[str, Any] = json.loads(message.content)
        return answer

    return call


def _pydantic_ai(effects: Effects, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from opledger.agents.pydantic_ai import effect_tool

    tool = effect_tool(effects, run=lambda ctx: "support:t-1", **options)
    asked: dict[str, Any] = {}

    def model(messages: list[Any], info: Any) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                asked["answer"] = part.content
                return ModelResponse(parts=[TextPart("done")])
        call = ToolCallPart("follow_up", asked["args"], tool_call_id=uuid.uuid4().hex)
        return ModelResponse(parts=[call])

    agent = Agent(FunctionModel(model), tools=[tool])

    def call(**args: Any) -> dict[str, Any]:
        asked["args"] = json.dumps(args)
        asyncio.run(agent.run("follow up"))
        answer = asked.pop("answer")
        return answer if isinstance(answer, dict) else json.loads(answer)

    return call


def _openai_agents(effects: Effects, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    from agents.tool_context import ToolContext

    from opledger.agents.openai_agents import bind_run, effect_tool

    tool = effect_tool(effects, **options)

    def call(**args: Any) -> dict[str, Any]:
        arguments = json.dumps({"repeat": None, **args})
        ctx = ToolContext(
            context=None,
            tool_name="follow_up",
            tool_call_id=f"call_{uuid.uuid4().hex[:8]}",
            tool_arguments=arguments,
        )

        async def invoke() -> Any:
            return await tool.on_invoke_tool(ctx, arguments)

        with bind_run(group_id="t-1"):
            answer: dict[str, Any] = json.loads(asyncio.run(invoke()))
        return answer

    return call


def _fields(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The case's fields as the args give them: the CRM's fields are flat JSON values."""
    owner = args["owner"]
    values = {k: args[k] for k in ("due", "at", "amount", "ref", "level", "link")}
    return args["case_id"], {"fields": {**values, "owner": f"{owner['name']} {owner['since']}"}}


def _settle(ledger: Ledger, op_id: str) -> None:
    claim = ledger.claim(op_id, owner="test-worker")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    ledger.record_outcome(claim, Confirmed(receipt_id=f"r-{op_id}", binding=binding))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_common_argument_types_reach_effect_of_as_json_values_and_are_recorded(
    framework: str, ledger: Ledger, effects: Effects
) -> None:
    seen: list[dict[str, Any]] = []

    def effect_of(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        seen.append(args)
        return _fields(args)

    call = _caller(framework, effects, effect_of)
    first = call(**ARGS)
    assert first["kind"] == "pending", first
    assert seen[0] == {
        "case_id": "case-318",
        "due": "2026-12-31",
        "at": "2026-12-04T10:30:00Z",
        "amount": "12.50",
        "ref": "0b9e4f8e-5c7a-4c1e-9d55-2b8a3f1e7c01",
        "level": "high",
        "link": "https://crm.acme.test/cases/318",
        "owner": {"name": "Ann", "since": "2025-01-02"},
    }
    assert ledger.payload(first["op_id"]) == _fields(seen[0])[1]
    again = call(**ARGS)  # asked again: the recorded act
    assert again["op_id"] == first["op_id"] and again["asked_before"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"fields": {"tags": {"a", "b"}}}, PayloadNotCanonicalizable),
        ({"fields": {"at": datetime(2026, 1, 1, tzinfo=UTC)}}, PayloadNotCanonicalizable),
        ({"fields": {"deep": json.loads("[" * 80 + "]" * 80)}}, PayloadTooDeep),
        ({"fields": {"text": "x" * (300 * 1024)}}, PayloadTooLarge),
    ],
)
def test_a_payload_effect_of_built_that_cannot_be_recorded_is_raised_not_answered(
    framework: str,
    payload: dict[str, Any],
    error: type[Exception],
    ledger: Ledger,
    effects: Effects,
) -> None:
    call = _caller(framework, effects, lambda args: (args["case_id"], payload))
    with pytest.raises(error) as raised:
        call(**ARGS)
    assert any("raised, not answered to the model" in n for n in raised.value.__notes__)
    assert not ledger.list(tenant="acme")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_after_a_deliberate_repeat_the_model_is_told_the_next_number(
    framework: str, ledger: Ledger, effects: Effects
) -> None:
    def effect_of(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return args["case_id"], {"fields": {"status": args["status"]}}

    call = _caller(framework, effects, effect_of, SetStatus)
    args = {"case_id": "case-318", "status": "waiting"}
    first = call(**args)
    _settle(ledger, first["op_id"])
    assert "`repeat` set to 2 " in call(**args)["message"]
    second = call(**args, repeat=2)
    assert second["op_id"] != first["op_id"] and not second["asked_before"]
    _settle(ledger, second["op_id"])
    again = call(**args, repeat=2)
    assert again["op_id"] == second["op_id"] and again["asked_before"]
    assert "`repeat` set to 3 (4 the time after that)" in again["message"]
    third = call(**args, repeat=3)
    assert third["op_id"] not in (first["op_id"], second["op_id"])
