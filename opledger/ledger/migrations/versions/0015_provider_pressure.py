"""provider pressure: fleet-wide concurrency slots, a rate bucket and a breaker per provider

- `provider_slots`: a provider's concurrency limit as rows, one per call that may be in
  flight at once; a claim takes a free one (FOR UPDATE SKIP LOCKED) and holds it until the
  call answers, or until its in-flight deadline when the answer was lost.
- `provider_pressure`: one row per provider that has a rate limit or has pushed back: the
  rate's theoretical arrival time (GCRA), the consecutive refusals to connect, the breaker
  (closed, open) and the pause that holds claims back (a Retry-After, an open breaker's
  next probe), with its reason and since when.
- `opledger_admit(...)`: called by the claim statement before it takes an operation: a
  paused provider, a full set of slots or an empty bucket refuse the claim with how long
  to wait and why, so a waiting operation costs no claim, fence or attempt.
- `opledger_press(...)`: called by the outcome statement: a refused connection counts
  toward the breaker, a "not now" pauses the provider, an answer closes the breaker.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The two functions, as schema.sql spells them (tests/integration/test_schema_sql.py
# compares their definitions).
ADMIT = """
CREATE FUNCTION opledger_admit(
    p_provider text, p_limits jsonb, p_token text, p_op_id text, p_hold interval
)
    RETURNS TABLE(admitted boolean, wait_s double precision, why text)
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
DECLARE
    p provider_pressure%ROWTYPE;
    n integer := (p_limits ->> 'concurrency')::integer;
    step interval := make_interval(secs => (p_limits ->> 'interval_s')::double precision);
    burst integer := coalesce((p_limits ->> 'burst')::integer, 1);
    free integer;
    next_at timestamp with time zone;
BEGIN
    SELECT * INTO p FROM provider_pressure WHERE provider = p_provider;
    -- paused (the provider asked us to wait, or its breaker waits for the next probe)
    IF p.paused_until > clock_timestamp() THEN
        RETURN QUERY SELECT false,
            extract(epoch FROM p.paused_until - clock_timestamp())::double precision,
            coalesce(p.pause_reason, 'paused');
        RETURN;
    END IF;
    -- concurrency: a free slot, locked until this statement ends
    IF n IS NOT NULL THEN
        SELECT s.slot INTO free FROM provider_slots AS s
        WHERE s.provider = p_provider AND s.slot <= n AND s.held_until <= clock_timestamp()
        ORDER BY s.slot LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF free IS NULL
           AND (SELECT count(*) FROM provider_slots WHERE provider = p_provider AND slot <= n) < n
        THEN
            INSERT INTO provider_slots (provider, slot)
            SELECT p_provider, g FROM generate_series(1, n) AS g ON CONFLICT DO NOTHING;
            SELECT s.slot INTO free FROM provider_slots AS s
            WHERE s.provider = p_provider AND s.slot <= n AND s.held_until <= clock_timestamp()
            ORDER BY s.slot LIMIT 1 FOR UPDATE SKIP LOCKED;
        END IF;
        IF free IS NULL THEN
            SELECT min(greatest(held_until, clock_timestamp())) INTO next_at FROM provider_slots
            WHERE provider = p_provider AND slot <= n;
            RETURN QUERY SELECT false,
                least(greatest(extract(epoch FROM next_at - clock_timestamp()), 0.01), 0.05)
                    ::double precision,
                format('%s calls in flight, the most allowed', n);
            RETURN;
        END IF;
    END IF;
    -- rate: a generic cell rate algorithm on one row (burst calls at once, then one a step)
    IF step IS NOT NULL THEN
        IF p.provider IS NULL THEN
            INSERT INTO provider_pressure (provider) VALUES (p_provider) ON CONFLICT DO NOTHING;
        END IF;
        UPDATE provider_pressure SET tat = greatest(tat, clock_timestamp()) + step
        WHERE provider = p_provider AND tat <= clock_timestamp() + step * (burst - 1);
        IF NOT FOUND THEN
            SELECT tat - step * (burst - 1) INTO next_at FROM provider_pressure
            WHERE provider = p_provider;
            RETURN QUERY SELECT false,
                greatest(extract(epoch FROM next_at - clock_timestamp()), 0.001)::double precision,
                format('%s calls a second, the most allowed',
                       round((1 / extract(epoch FROM step))::numeric, 2)::double precision);
            RETURN;
        END IF;
    END IF;
    -- an open breaker lets one call through at a time: the probe
    IF p.breaker = 'open' THEN
        UPDATE provider_pressure SET paused_until = clock_timestamp() + p_hold
        WHERE provider = p_provider AND breaker = 'open'
          AND (paused_until IS NULL OR paused_until <= clock_timestamp());
        IF NOT FOUND THEN
            RETURN QUERY SELECT false, 0.05::double precision, 'a probe is in flight';
            RETURN;
        END IF;
    END IF;
    IF free IS NOT NULL THEN
        UPDATE provider_slots
        SET held_until = clock_timestamp() + p_hold, claim_token = p_token, op_id = p_op_id
        WHERE provider = p_provider AND slot = free;
    END IF;
    RETURN QUERY SELECT true, 0::double precision, NULL::text;
END;
$$;
"""

PRESS = """
CREATE FUNCTION opledger_press(
    p_provider text, p_kind text, p_pause interval, p_reason text, p_after integer,
    p_probe interval, p_probe_max interval
)
    RETURNS text
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
DECLARE
    p provider_pressure%ROWTYPE;
BEGIN
    IF p_kind = 'answered' THEN
        SELECT * INTO p FROM provider_pressure WHERE provider = p_provider;
        IF NOT FOUND OR (p.failures = 0 AND p.breaker = 'closed') THEN
            RETURN NULL;
        END IF;
    ELSIF p_kind NOT IN ('refused', 'throttled') THEN
        RETURN NULL;
    END IF;
    INSERT INTO provider_pressure (provider) VALUES (p_provider) ON CONFLICT DO NOTHING;
    SELECT * INTO p FROM provider_pressure WHERE provider = p_provider FOR UPDATE;
    IF p_kind = 'answered' THEN
        -- the provider answered: it is reachable; an open breaker closes
        UPDATE provider_pressure
        SET failures = 0, probes = 0, breaker = 'closed', updated_at = now(),
            paused_until = CASE WHEN p.breaker = 'open' THEN NULL ELSE paused_until END,
            paused_since = CASE WHEN p.breaker = 'open' THEN NULL ELSE paused_since END,
            pause_reason = CASE WHEN p.breaker = 'open' THEN NULL ELSE pause_reason END
        WHERE provider = p_provider;
        RETURN CASE WHEN p.breaker = 'open' THEN 'closed' END;
    ELSIF p_kind = 'throttled' THEN
        -- "not now": nothing starts before the wait it asked for; it answered, so it is up
        UPDATE provider_pressure
        SET failures = 0, probes = 0, breaker = 'closed', updated_at = now(),
            paused_until = greatest(paused_until, clock_timestamp() + p_pause),
            paused_since = CASE WHEN paused_until > clock_timestamp() AND p.breaker = 'closed'
                                THEN paused_since ELSE now() END,
            pause_reason = p_reason
        WHERE provider = p_provider;
        RETURN 'paused';
    ELSIF p.breaker = 'open' THEN
        -- refused again while open (the probe, or a call claimed before it opened): the
        -- next probe waits twice as long as the last one did, up to the most
        UPDATE provider_pressure
        SET failures = failures + 1, probes = probes + 1, updated_at = now(),
            paused_until = clock_timestamp() + least(p_probe * power(2, p.probes + 1), p_probe_max)
        WHERE provider = p_provider;
        RETURN 'open';
    ELSIF p.failures + 1 >= p_after THEN
        UPDATE provider_pressure
        SET failures = failures + 1, probes = 0, breaker = 'open', updated_at = now(),
            paused_since = now(), paused_until = clock_timestamp() + p_probe,
            pause_reason = p_reason
        WHERE provider = p_provider;
        RETURN 'opened';
    END IF;
    UPDATE provider_pressure SET failures = failures + 1, updated_at = now()
    WHERE provider = p_provider;
    RETURN NULL;
END;
$$;
"""


def upgrade() -> None:
    op.create_table(
        "provider_slots",
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column(
            "held_until",
            sa.DateTime(timezone=True),
            server_default=sa.text("'-infinity'::timestamp with time zone"),
            nullable=False,
        ),
        sa.Column("claim_token", sa.Text(), nullable=True),
        sa.Column("op_id", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("provider", "slot", name=op.f("pk_provider_slots")),
    )
    op.create_table(
        "provider_pressure",
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column(
            "tat",
            sa.DateTime(timezone=True),
            server_default=sa.text("'-infinity'::timestamp with time zone"),
            nullable=False,
        ),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("breaker", sa.Text(), server_default=sa.text("'closed'"), nullable=False),
        sa.Column("probes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paused_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "breaker IN ('closed', 'open')", name=op.f("ck_provider_pressure_breaker")
        ),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_provider_pressure")),
    )
    op.execute(ADMIT)
    op.execute(PRESS)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION opledger_press(text, text, interval, text, integer, interval, interval)"
    )
    op.execute("DROP FUNCTION opledger_admit(text, jsonb, text, text, interval)")
    op.drop_table("provider_pressure")
    op.drop_table("provider_slots")
