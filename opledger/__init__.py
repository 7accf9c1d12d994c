"""opledger: a durable operation ledger for external side effects caused by agents and workers."""

__version__ = "0.1.0"
