"""Kept for configurations that name `opledger.tasks.scheduler:Scheduler`: beat's scheduler
lives in `opledger.tasks.beat` (`beat_scheduler = "opledger.tasks.beat:Scheduler"`)."""

from .beat import Scheduler

__all__ = ["Scheduler"]
