"""What to change in a contract after `opledger contract check` found it wrong.

A fact that promises more than the provider keeps is how a duplicate gets through: the
decision resends under a key the provider released or forgot, or trusts an answer it
should not. A fact that promises less is safe, and only costs lookups or a person's time.
Each hint names the field to change, the value to give it, and what the probe saw; the
over-promising ones come first wherever they are shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from opledger.ledger.contract import Contract


@dataclass(frozen=True)
class Hint:
    """`change`: the field and its value; `why`: what the probe saw; `over_promises`: the
    declared fact lets a retry repeat the effect or confirm what is not ours."""

    change: str
    why: str
    over_promises: bool

    def __str__(self) -> str:
        return f"{self.change}: {self.why}"


def hint_for(fact: str, declared: str, observed: str, contract: Contract) -> Hint | None:
    """The change a disagreement on `fact` asks for, or None when none can be named."""
    hinter = _HINTERS.get(fact)
    return hinter(declared, observed, contract) if hinter else None


def _lookup_advice(contract: Contract) -> str:
    if contract.lookup.kind != "none":
        return ""
    return (
        "; without a lookup each such answer goes to a person: give the adapter one that "
        "reads your own records by a reference you send with the request "
        '(lookup.kind="status_api")'
    )


def _after_error(declared: str, observed: str, contract: Contract) -> Hint | None:
    if observed == "key_released":
        return Hint(
            'idempotency.after_error="key_released"',
            "a 500 after the change released the key, and the same-key resend ran the "
            "change again" + _lookup_advice(contract),
            over_promises=True,
        )
    if observed == "replayed":
        return Hint(
            'idempotency.after_error="replayed"',
            "the provider stored the 500 and replays it: a same-key resend learns nothing",
            over_promises=declared != "key_released",
        )
    return None


def _keys_durable(declared: str, observed: str, contract: Contract) -> Hint | None:
    if "forgotten" in observed:
        return Hint(
            "idempotency.keys_durable=False",
            "a restart forgot the key, and the same-key resend ran the change again"
            + _lookup_advice(contract),
            over_promises=True,
        )
    if "survived" in observed:
        return Hint(
            "idempotency.keys_durable=True",
            "the key survived a restart (False is safe: it costs a lookup or a person after "
            "every lost answer)",
            over_promises=False,
        )
    return None


def _idempotency(declared: str, observed: str, contract: Contract) -> Hint | None:
    if "applied twice" in observed:
        return Hint(
            'idempotency=Idempotency(kind="none")',
            "the same key and body sent twice were applied twice",
            over_promises=True,
        )
    return Hint(
        'idempotency.kind="keyed" (with its retention)',
        "the same key and body sent twice were answered from the key",
        over_promises=False,
    )


def _payload_checked(declared: str, observed: str, contract: Contract) -> Hint | None:
    if declared == "true":
        return Hint(
            "idempotency.payload_checked=False",
            f"another body under a used key was {observed}",
            over_promises=True,
        )
    return Hint(
        "idempotency.payload_checked=True",
        "another body under a used key was refused",
        over_promises=False,
    )


def _concurrent(declared: str, observed: str, contract: Contract) -> Hint | None:
    if observed == "both executed":
        return Hint(
            'idempotency.concurrent="unchecked"',
            "two requests with one key at once both executed",
            over_promises=True,
        )
    waited = re.search(r"after ([0-9.]+) s", observed)
    if declared.startswith("conflict") and waited:
        return Hint(
            f"idempotency.conflict_wait=timedelta(seconds={float(waited[1]):g}), and a "
            "request_timeout above it",
            f"the provider held the second request {waited[1]} s before refusing it",
            over_promises=True,
        )
    return Hint(
        'idempotency.concurrent="conflict"',
        "the second of two requests with one key was refused as in progress",
        over_promises=False,
    )


_BINDS_ORDER = ("nothing", "key", "key_and_digest")


def _response_binds(declared: str, observed: str, contract: Contract) -> Hint | None:
    if observed not in _BINDS_ORDER:  # another body's digest: the adapter's binding is wrong
        return Hint(
            "the adapter's success binding",
            f"a success names {observed}: bind what the provider's answer says",
            over_promises=True,
        )
    less = _BINDS_ORDER.index(observed) < _BINDS_ORDER.index(declared)
    return Hint(
        f'response_binds="{observed}"',
        f"a success names {observed if observed != 'nothing' else 'neither our key nor our body'}",
        over_promises=less,
    )


def _max_key_length(declared: str, observed: str, contract: Contract) -> Hint | None:
    probed = declared if declared.isdigit() else "300"
    return Hint(
        "idempotency.max_key_length=<the provider's limit>",
        f"a {probed}-character key was not accepted ({observed})",
        over_promises=True,
    )


def _lookup(declared: str, observed: str, contract: Contract) -> Hint | None:
    if observed.startswith("rejected"):
        return Hint(
            "the adapter's lookup",
            "it says rejected of a request the provider applied",
            over_promises=True,
        )
    return Hint(
        'lookup.kind="search" (with its lag), or "none"',
        f"a status API must find the request just made; it answered {observed}",
        over_promises=True,
    )


def _lookup_absent(declared: str, observed: str, contract: Contract) -> Hint | None:
    if observed.startswith(("confirmed", "rejected")):
        return Hint(
            "the adapter's lookup",
            f"it says {observed}: nothing may settle a request never made",
            over_promises=True,
        )
    return Hint(
        'lookup.kind="search" (with its lag), or "none"',
        f"only a lookup that says absent of a request never made may be a status API ({observed})",
        over_promises=True,
    )


def _lookup_binds(declared: str, observed: str, contract: Contract) -> Hint | None:
    return Hint(
        "the adapter's lookup binding",
        f"what it finds names {observed}; it must name our key or receipt, and our body's "
        "digest unless the provider checks bodies (idempotency.payload_checked)",
        over_promises=True,
    )


_HINTERS = {
    "after_error": _after_error,
    "keys_durable": _keys_durable,
    "idempotency": _idempotency,
    "payload_checked": _payload_checked,
    "concurrent": _concurrent,
    "response_binds": _response_binds,
    "max_key_length": _max_key_length,
    "lookup": _lookup,
    "lookup_absent": _lookup_absent,
    "lookup_binds": _lookup_binds,
}

__all__ = ["Hint", "hint_for"]
