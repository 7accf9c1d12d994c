"""`opledger demo`: the onboarding story, then the same story broken at every crash window
(`run`). Its rooms: `services` (what it runs on), `workers` (started ahead, switched onto
the queues), `story` (the agent's two operations and how a scenario is shown), `scenarios`
(the crash windows), `common`."""

from .common import Row
from .run import planned_scenarios, run_demo

__all__ = ["Row", "planned_scenarios", "run_demo"]
