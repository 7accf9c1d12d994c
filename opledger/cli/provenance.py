"""Who ran a command that changes an operation: beside the free-text `--operator`, the
operating-system user the command ran as and the database role it wrote with.

Neither is proof of identity (the OS user name comes from the environment, as
`getpass.getuser` reads it; the role is whatever the connection URL logs in as), but both
are facts an auditor can check against the host's and the database's own logs. They are
kept in fields the ledger already has (a transition's actor, a resolution's note): see
`cancel_actor` and `resolution_note`.
"""

from __future__ import annotations

import getpass

from sqlalchemy import text

from opledger.ledger import Ledger
from opledger.ledger.ids import check_identifier, check_operator

#: what a resolution's note may hold (`Reviews.resolve`), the facts appended included
NOTE_LIMIT = 4000


def os_user() -> str:
    """The operating-system user this command runs as, or "unknown" when there is none
    (`getpass.getuser` raises when neither the environment nor the password database
    names one, e.g. in a container running as an unnamed uid)."""
    try:
        name = getpass.getuser()
    except Exception:  # OSError or KeyError, depending on the Python version and platform
        return "unknown"
    name = " ".join(name.split())
    return name if name and name.isprintable() else "unknown"


def database_role(ledger: Ledger) -> str:
    """The Postgres role the ledger's connections write with (`current_user`), and the
    login role too when it differs (`session_user`, after a `SET ROLE`)."""
    with ledger.engine.connect() as conn:
        current, session = conn.execute(text("SELECT current_user, session_user")).one()
    if current == session:
        return f"db role {current}"
    return f"db role {current} (session user {session})"


def ran_by(ledger: Ledger) -> str:
    """'os user bob, db role opledger': who ran this command, as the host and the
    database know it."""
    return f"os user {os_user()}, {database_role(ledger)}"


def cancel_actor(ledger: Ledger, operator: str | None) -> str:
    """The actor a CLI cancel records (a transition's `actor`, its `by`):
    'alice (os user bob, db role opledger)', or without `--operator` just
    'os user bob, db role opledger'. A malformed operator name is `InvalidInput`."""
    facts = ran_by(ledger)
    if operator is None:
        return facts
    return f"{check_operator('operator', operator)} ({facts})"


def resolution_note(ledger: Ledger, note: str) -> str:
    """A review resolution's note with who ran the command appended:
    'seen in the CRM audit log [ran as os user bob, db role opledger]'. The operator's
    name stays the `--operator` given (the view they were shown is recorded under it);
    the note is kept with the resolution, the closed review and the transition's reason.
    A note too long to carry the facts is `InvalidInput`, saying how long it may be."""
    suffix = f" [ran as {ran_by(ledger)}]"
    check_identifier("note", note, max_length=NOTE_LIMIT - len(suffix))
    return note + suffix
