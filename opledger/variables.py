"""Which `OPLEDGER_` variables are settings, and what a mistyped one most likely means:
OPLEDGER_DB_URL is OPLEDGER_DATABASE_URL. Given the settings' names (upper-case, without
the prefix: `opledger.settings.setting_names()`), so this module needs nothing else."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

#: OPLEDGER_ variables that are not settings but are read by the tooling
TOOLING_VARIABLES = frozenset(
    {
        "OPLEDGER_DEBUG",
        "OPLEDGER_STATE_DIR",
        "OPLEDGER_CRASHPOINT",
        "OPLEDGER_CRASHPOINT_SIGNAL",
        "OPLEDGER_BEHAVIOUR_EXAMPLES",
        "OPLEDGER_MCP_TOKEN",  # the caller of `opledger mcp serve --transport stdio`
    }
)


#: words people write for a setting's word: OPLEDGER_DB_URL means OPLEDGER_DATABASE_URL
WORD_ALIASES = {
    "DB": ("DATABASE",),
    "PG": ("DATABASE",),
    "POSTGRES": ("DATABASE",),
    "POSTGRESQL": ("DATABASE",),
    "DSN": ("DATABASE", "URL"),
    "URI": ("URL",),
    "REDIS": ("BROKER",),
    "AMQP": ("BROKER",),
    "CELERY": (),  # OPLEDGER_CELERY_BROKER_URL: Celery's own name, prefixed
    "SECS": ("SECONDS",),
    "SEC": ("SECONDS",),
    "PASS": ("PASSWORD",),
    "PWD": ("PASSWORD",),
}


def suggestion(variable: str, known: Collection[str]) -> str | None:
    """The setting an unknown `OPLEDGER_` variable most likely means, or None.

    Compared without the prefix every name shares (which made OPLEDGER_DB_URL look closer
    to OPLEDGER_CRM_URL than to OPLEDGER_DATABASE_URL): the words people use for a
    setting's words first (DB, URI, REDIS, ...), then a close spelling of the whole name,
    then the one setting with the fewest other words that has all of its words in order
    (OPLEDGER_SCHEMA: OPLEDGER_DATABASE_SCHEMA)."""
    prefix = "OPLEDGER_"
    words = [w for w in variable.removeprefix(prefix).split("_") if w]
    words = [part for w in words for part in WORD_ALIASES.get(w, (w,))]
    name = "_".join(words)
    if name in known:
        return prefix + name
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    if close:
        return prefix + close[0]
    holding = sorted(
        (len(k.split("_")), k) for k in known if words and _in_order(words, k.split("_"))
    )
    if holding and (len(holding) == 1 or holding[0][0] < holding[1][0]):
        return prefix + holding[0][1]
    return None


def _in_order(words: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(word in rest for word in words)


def unknown(environ: Mapping[str, str], known: Collection[str]) -> list[str]:
    """`OPLEDGER_` variables of `environ` that are no setting of `known` (likely typos),
    each with a suggestion."""
    settings = {f"OPLEDGER_{name}" for name in known}
    found = []
    for key in sorted(environ):
        if key.startswith("OPLEDGER_") and key not in settings and key not in TOOLING_VARIABLES:
            meant = suggestion(key, known)
            found.append(f"{key} (did you mean {meant}?)" if meant else key)
    return found


def typo_hint(name: str, known: Collection[str], environ: Mapping[str, str]) -> str:
    """What a message that `OPLEDGER_<name>` is not set adds when a variable of `environ`
    that likely means it is set."""
    meant = f"OPLEDGER_{name}"
    typos = [
        key
        for key in sorted(environ)
        if key.startswith("OPLEDGER_")
        and key != meant
        and key not in TOOLING_VARIABLES
        and suggestion(key, known) == meant
    ]
    return f"; {typos[0]} is set, a typo?" if typos else ""
