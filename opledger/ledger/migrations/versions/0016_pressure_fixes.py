"""provider pressure, fixed: the probe knows itself, and waiting for a provider does not
slow the relay down

An open breaker lets one call through at a time (the probe). Until now every refusal that
came back while it was open moved the next probe, so calls claimed before the breaker
opened and refused late pushed the first probe out to the longest wait and cut the probe's
hold short (a second probe could start beside the first), and a probe answered with "not
now" kept the provider paused for the rest of the probe's hold.

- `provider_pressure.probe_token`: the claim token of the probe in flight, set by
  `opledger_admit` when it lets the probe through;
- `opledger_press(..., p_token)`: only the probe's refusal doubles the wait for the next
  one; a late refusal of another call counts as a refusal and nothing more; a "not now"
  that closes an open breaker pauses the provider for the wait it asked for. A statement
  that names no token (a worker of the previous version, during an upgrade) is read as
  the probe's, as before.
- `operations.relay_lost`: the relay's lost-message backoff doubled with every publish
  (`relay_gen`), so an operation deferred a few times for its provider's room had its
  message, once lost, published again only after 16 times the relay's wait. It now
  doubles with each re-publication of a message presumed lost, and a publish that was due
  (a provider's wait ended, a dependency confirmed) starts it again.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_PRESS = "opledger_press(text, text, interval, text, integer, interval, interval)"

# The two functions, as schema.sql spells them (tests/integration/test_schema_sql.py
# compares their definitions).
ADMIT = """
CREATE OR REPLACE FUNCTION opledger_admit(
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
    -- an open breaker lets one call through at a time: the probe (its claim token kept,
    -- so that only its refusal moves the next probe)
    IF p.breaker = 'open' THEN
        UPDATE provider_pressure SET paused_until = clock_timestamp() + p_hold,
            probe_token = p_token
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
    p_probe interval, p_probe_max interval, p_token text DEFAULT NULL
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
        SET failures = 0, probes = 0, breaker = 'closed', updated_at = now(), probe_token = NULL,
            paused_until = CASE WHEN p.breaker = 'open' THEN NULL ELSE paused_until END,
            paused_since = CASE WHEN p.breaker = 'open' THEN NULL ELSE paused_since END,
            pause_reason = CASE WHEN p.breaker = 'open' THEN NULL ELSE pause_reason END
        WHERE provider = p_provider;
        RETURN CASE WHEN p.breaker = 'open' THEN 'closed' END;
    ELSIF p_kind = 'throttled' THEN
        -- "not now": nothing starts before the wait it asked for; it answered, so it is up
        -- (an open breaker's pause was the probe's hold, which the answer ends)
        UPDATE provider_pressure
        SET failures = 0, probes = 0, breaker = 'closed', updated_at = now(), probe_token = NULL,
            paused_until = CASE WHEN p.breaker = 'open' THEN clock_timestamp() + p_pause
                                ELSE greatest(paused_until, clock_timestamp() + p_pause) END,
            paused_since = CASE WHEN paused_until > clock_timestamp() AND p.breaker = 'closed'
                                THEN paused_since ELSE now() END,
            pause_reason = p_reason
        WHERE provider = p_provider;
        RETURN 'paused';
    ELSIF p.breaker = 'open' AND p_token IS DISTINCT FROM p.probe_token AND p_token IS NOT NULL
    THEN
        -- refused late, by a call claimed before the breaker opened: one more refusal; the
        -- probe in flight and the next probe's time stay as they are
        UPDATE provider_pressure SET failures = failures + 1, updated_at = now()
        WHERE provider = p_provider;
        RETURN 'open';
    ELSIF p.breaker = 'open' THEN
        -- the probe refused: the next one waits twice as long as the last did, up to the most
        UPDATE provider_pressure
        SET failures = failures + 1, probes = probes + 1, updated_at = now(), probe_token = NULL,
            paused_until = clock_timestamp() + least(p_probe * power(2, p.probes + 1), p_probe_max)
        WHERE provider = p_provider;
        RETURN 'open';
    ELSIF p.failures + 1 >= p_after THEN
        UPDATE provider_pressure
        SET failures = failures + 1, probes = 0, breaker = 'open', updated_at = now(),
            probe_token = NULL, paused_since = now(), paused_until = clock_timestamp() + p_probe,
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
    op.add_column("provider_pressure", sa.Column("probe_token", sa.Text(), nullable=True))
    op.add_column(
        "operations",
        sa.Column("relay_lost", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(ADMIT)
    op.execute(f"DROP FUNCTION {OLD_PRESS}")
    op.execute(PRESS)


def _previous() -> ModuleType:
    """Revision 0015, whose functions a downgrade puts back."""
    path = Path(__file__).with_name("0015_provider_pressure.py")
    spec = importlib.util.spec_from_file_location("opledger_migration_0015", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    previous = _previous()
    op.execute(f"DROP FUNCTION {OLD_PRESS[:-1]}, text)")
    op.execute(previous.PRESS)
    op.execute(previous.ADMIT.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.drop_column("provider_pressure", "probe_token")
    op.drop_column("operations", "relay_lost")
