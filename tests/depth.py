"""How many cases a property test generates.

`make test` is the inner loop: each property runs a fifth of its full count (at least 50),
new random cases every run. `make mutate` (the `mutmut` hypothesis profile, loaded before
the test modules are imported) and `OPLEDGER_DEEP_PROPERTIES=1 make test` run the full
count, where a mutant or a rare case must be found."""

from __future__ import annotations

import os

from hypothesis import settings


def deep() -> bool:
    return (
        os.environ.get("OPLEDGER_DEEP_PROPERTIES") == "1"
        or settings.get_current_profile_name() == "mutmut"
    )


def examples(full: int) -> int:
    """`full` in a deep run, else a fifth of it (at least 50)."""
    return full if deep() else max(50, full // 5)
