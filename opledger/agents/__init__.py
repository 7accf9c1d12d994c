"""The agent-facing API: cause an external effect once, wait for how it ended, order effects.

`Effects.effect(...)` records one act of one workflow run — keyed by the act (its action,
target, intent fields and purpose), never by an id the model or the transport chose —,
enqueues it and (optionally) waits for it to settle; an act asked again gets its recorded
operation back. `opledger.agents.langgraph` makes LangChain tools of it, run by a LangGraph
thread (the `[langgraph]` extra), `opledger.agents.pydantic_ai` Pydantic AI tools (the
`[pydantic-ai]` extra) and `opledger.agents.openai_agents` OpenAI Agents SDK tools (the
`[openai-agents]` extra); this package itself imports none of those frameworks.
"""

from .effects import (
    EffectCancelled,
    EffectConfirmed,
    EffectPending,
    EffectRejected,
    EffectResult,
    Effects,
    EffectUnknown,
    at_rest,
)
from .listener import CHANNEL

__all__ = [
    "CHANNEL",
    "EffectCancelled",
    "EffectConfirmed",
    "EffectPending",
    "EffectRejected",
    "EffectResult",
    "EffectUnknown",
    "Effects",
    "at_rest",
]
