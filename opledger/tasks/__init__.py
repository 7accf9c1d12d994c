"""opledger's Celery tasks. `register(app)` puts them on a Celery app of your own."""

from .integrate import AppMisconfigured, register

__all__ = ["AppMisconfigured", "register"]
