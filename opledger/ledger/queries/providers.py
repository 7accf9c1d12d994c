"""What the ledger holds of each provider's pressure: read for people, forgotten, and the
deferral of a prepared operation the gate refused (`ledger.providers`)."""

from __future__ import annotations

from sqlalchemy import text

#: every provider with a row of pressure, a slot or a waiting operation, with its state
PROVIDERS = text(
    """
    WITH waiting AS (
        SELECT provider, count(*) AS n, min(next_check_at) AS next_at
        FROM operations
        WHERE status = 'prepared' AND next_check_at IS NOT NULL
        GROUP BY provider
    ),
    slots AS (
        SELECT provider, count(*) FILTER (WHERE held_until > now()) AS in_flight
        FROM provider_slots GROUP BY provider
    ),
    names AS (
        SELECT provider FROM provider_pressure
        UNION SELECT provider FROM slots
        UNION SELECT provider FROM waiting
    )
    SELECT names.provider, p.breaker, p.failures, p.paused_until, p.paused_since,
           p.pause_reason, coalesce(slots.in_flight, 0) AS in_flight,
           coalesce(waiting.n, 0) AS waiting, waiting.next_at, now() AS db_now
    FROM names
    LEFT JOIN provider_pressure AS p ON p.provider = names.provider
    LEFT JOIN slots ON slots.provider = names.provider
    LEFT JOIN waiting ON waiting.provider = names.provider
    ORDER BY names.provider
    """
)

DEFER = text(
    """
    UPDATE operations SET next_check_at = :until, updated_at = now()
    WHERE id = :op_id AND status = 'prepared'
    RETURNING id
    """
)


#: a provider's pressure forgotten: its pause, breaker, refusals and rate bucket (its row),
#: and the slots no call holds; a slot a call in flight holds stays until it answers
FORGET_PROVIDER = text(
    """
    WITH pressure AS (
        DELETE FROM provider_pressure WHERE provider = :provider RETURNING provider
    ),
    slots AS (
        DELETE FROM provider_slots WHERE provider = :provider AND held_until <= now()
        RETURNING slot
    )
    SELECT (SELECT count(*) FROM pressure) AS pressure, (SELECT count(*) FROM slots) AS slots
    """
)
