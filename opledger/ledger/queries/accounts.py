"""The review console's own statements (`console.accounts`): its operators, their sessions
and the record of every sign-in, in the ledger's database and schema."""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.types import Text

_OPERATOR_COLUMNS = (
    "o.name, o.all_tenants, o.tenants, o.password_hash IS NOT NULL AS has_password, "
    "o.created_by, o.created_at, o.disabled_at, o.disabled_by"
)

INSERT_OPERATOR = text(
    f"""
    INSERT INTO operators AS o (name, password_hash, all_tenants, tenants, created_by)
    VALUES (:name, :password_hash, :all_tenants, :tenants, :by)
    ON CONFLICT (name) DO NOTHING
    RETURNING {_OPERATOR_COLUMNS}
    """
).bindparams(bindparam("tenants", type_=ARRAY(Text)))

DISABLE_OPERATOR = text(
    f"""
    WITH o AS (
        UPDATE operators SET disabled_at = coalesce(disabled_at, now()),
                             disabled_by = coalesce(disabled_by, :by)
        WHERE name = :name
        RETURNING *
    ), ended AS (
        UPDATE console_sessions SET ended_at = now()
        WHERE operator = :name AND ended_at IS NULL
    )
    SELECT {_OPERATOR_COLUMNS} FROM o
    """
)

SELECT_OPERATORS = text(f"SELECT {_OPERATOR_COLUMNS} FROM operators AS o ORDER BY o.name")

SELECT_LOGIN = text(
    f"SELECT {_OPERATOR_COLUMNS}, o.password_hash FROM operators AS o WHERE o.name = :name"
)

UPDATE_HASH = text("UPDATE operators SET password_hash = :hash WHERE name = :name")

COUNT_ENABLED = text("SELECT count(*) FROM operators WHERE disabled_at IS NULL")

INSERT_SESSION = text(
    """
    INSERT INTO console_sessions (id, operator, csrf_token, expires_at)
    VALUES (:id, :operator, :csrf, now() + :lifetime)
    RETURNING expires_at
    """
)

# One round trip per request: the session is valid (not ended, not past its absolute expiry,
# used within the idle timeout), its operator still enabled; it counts as used now.
TOUCH_SESSION = text(
    f"""
    UPDATE console_sessions AS s SET last_seen_at = now()
    FROM operators AS o
    WHERE s.id = :id AND o.name = s.operator AND o.disabled_at IS NULL
      AND s.ended_at IS NULL AND s.expires_at > now() AND s.last_seen_at > now() - :idle
    RETURNING {_OPERATOR_COLUMNS}, s.id, s.csrf_token, s.expires_at
    """
)

SET_FLASH = text("UPDATE console_sessions SET flash = :flash WHERE id = :id").bindparams(
    bindparam("flash", type_=JSONB)
)

# the notice, once: read and cleared in one statement, only on the page it is about
TAKE_FLASH = text(
    """
    UPDATE console_sessions AS s SET flash = NULL
    FROM (SELECT id, flash FROM console_sessions WHERE id = :id FOR UPDATE) AS old
    WHERE s.id = old.id AND old.flash ->> 'page' = :page
    RETURNING old.flash
    """
)

INSERT_ATTEMPT = text(
    "INSERT INTO signin_attempts (operator, address, ok) VALUES (:operator, :address, :ok)"
)

# Failures of this name since its last success, and of this address, within the window.
SELECT_FAILURES = text(
    """
    WITH since AS (
        SELECT greatest(now() - :window, coalesce(
            (SELECT max(at) FROM signin_attempts WHERE operator = :operator AND ok),
            '-infinity')) AS t
    )
    SELECT
        (SELECT count(*) FROM signin_attempts, since
         WHERE operator = :operator AND NOT ok AND at > since.t) AS operator_n,
        (SELECT max(at) FROM signin_attempts, since
         WHERE operator = :operator AND NOT ok AND at > since.t) AS operator_last,
        (SELECT count(*) FROM signin_attempts
         WHERE address = :address AND NOT ok AND at > now() - :window) AS address_n,
        (SELECT max(at) FROM signin_attempts
         WHERE address = :address AND NOT ok AND at > now() - :window) AS address_last,
        now() AS now
    """
)

SELECT_ATTEMPTS = text(
    "SELECT at, operator, address, ok FROM signin_attempts WHERE operator = :operator "
    "ORDER BY at DESC, id DESC LIMIT :limit"
)

PURGE_ATTEMPTS = text("DELETE FROM signin_attempts WHERE at < now() - :keep")

END_SESSION = text("UPDATE console_sessions SET ended_at = now() WHERE id = :id")

PURGE_SESSIONS = text(
    "DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day' "
    "OR ended_at < now() - interval '1 day'"
)
