"""The agent-facing API: cause an external effect once, wait for how it ended, order effects.

`Effects.effect(...)` records the intent of one step of one workflow run, enqueues it and
(optionally) waits for it to settle; `opledger.agents.langgraph` keys it by a LangGraph
thread, node and tool call (the `[langgraph]` extra). This package imports neither
LangGraph nor LangChain.
"""

from .effects import (
    CHANNEL,
    EffectCancelled,
    EffectConfirmed,
    EffectPending,
    EffectRejected,
    EffectResult,
    Effects,
    EffectUnknown,
    settled,
)

__all__ = [
    "CHANNEL",
    "EffectCancelled",
    "EffectConfirmed",
    "EffectPending",
    "EffectRejected",
    "EffectResult",
    "EffectUnknown",
    "Effects",
    "settled",
]
