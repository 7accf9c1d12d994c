"""the ledger is a checkpoint too: epochs, keys from the intent, orphan receipts

A failover to an asynchronous standby, or a restore, can take back claims, outcomes and
whole operations that workers acted on. This revision gives the ledger what it needs to
notice and to recover from provider evidence instead of sending blind:

- `ledger_epochs`: where the ledger has run. Epoch 0 is this database as the migration
  found it (its timeline); a later epoch is a switch some process saw (another timeline, or
  the ledger behind what a process had seen of it), with the fence floor every open
  operation was raised to and the window in which new asks are not sent blind.
- `ledger_identity.key_namespace`: mixed into the idempotency keys now derived from the
  intent, so an act asked again after its record was lost reaches the provider under the
  key it already saw (existing operations keep their keys).
- `orphan_receipts`: a provider's answer to a claim the ledger no longer knows, kept.
- `opledger_timeline()`, `opledger_quarantine(...)`, `opledger_switch(...)`; the guard
  lets a prepared operation become unknown (quarantined: an attempt may have been made).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells them (tests/integration/test_schema_sql.py compares the catalog).
TABLES = """
-- The ledger's own history of where it runs (migration 0017): epoch 0 is the database the
-- ledger was created on; every later epoch is a switch some process saw, a promotion to
-- another timeline, or a step back (a restore), when the ledger may have lost committed
-- work. `fence_floor`: the fence every operation still open then was raised to, at least
-- (the switch's time in microseconds, so a later switch's floor is above any fence an
-- earlier one issued, even one whose record was lost). Operations prepared before
-- `suspect_until` are never first-dispatched blind: an earlier ask of the same act may have
-- been forgotten.
CREATE TABLE ledger_epochs (
    epoch bigint NOT NULL,
    kind text NOT NULL,
    timeline integer,
    previous_timeline integer,
    began_at timestamp with time zone DEFAULT now() NOT NULL,
    lsn text,
    seen_lsn text,
    detected_by text NOT NULL,
    reason text NOT NULL,
    fence_floor bigint DEFAULT 0 NOT NULL,
    quarantined integer DEFAULT 0 NOT NULL,
    suspect_until timestamp with time zone,
    ended_by text,
    CONSTRAINT ck_ledger_epochs_kind CHECK ((kind = ANY (ARRAY['initial'::text,
        'timeline'::text, 'rewind'::text])))
);
ALTER TABLE ONLY ledger_epochs ADD CONSTRAINT pk_ledger_epochs PRIMARY KEY (epoch);

-- What makes this ledger's idempotency keys its own (migration 0017): a random namespace,
-- made once, kept by every backup and standby, mixed into every key derived from an intent.
CREATE TABLE ledger_identity (
    id integer DEFAULT 1 NOT NULL,
    key_namespace text DEFAULT (gen_random_uuid())::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_ledger_identity_one_row CHECK ((id = 1))
);
ALTER TABLE ONLY ledger_identity ADD CONSTRAINT pk_ledger_identity PRIMARY KEY (id);

-- A provider's answer to a claim the ledger has no record of (migration 0017): the claim,
-- or its whole operation, was lost with a switch (or the claim was never the ledger's).
-- Kept, never dropped; a forgotten one is tied to its operation as evidence once the
-- operation is found, or asked again (`matched_op_id`).
CREATE TABLE orphan_receipts (
    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    op_id text NOT NULL,
    tenant text NOT NULL,
    workflow_id text NOT NULL,
    intent_key text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    payload_digest text NOT NULL,
    idempotency_key text NOT NULL,
    fence bigint NOT NULL,
    attempt_n integer,
    claim_epoch bigint,
    ledger_epoch bigint,
    forgotten boolean NOT NULL,
    why text NOT NULL,
    reported_by text NOT NULL,
    verdict text NOT NULL,
    binding jsonb DEFAULT '{}'::jsonb NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    matched_op_id text,
    matched_at timestamp with time zone
);
ALTER TABLE ONLY orphan_receipts ADD CONSTRAINT pk_orphan_receipts PRIMARY KEY (id);
CREATE INDEX ix_orphan_receipts_intent ON orphan_receipts USING btree (tenant, workflow_id,
    intent_key) WHERE ((matched_op_id IS NULL) AND forgotten);
CREATE INDEX ix_orphan_receipts_op_id ON orphan_receipts USING btree (op_id);
"""

FUNCTIONS = """
-- The timeline the server writes WAL on (the first eight hex digits of its WAL file's
-- name): a promotion or a point-in-time restore moves it on (migration 0017).
CREATE FUNCTION opledger_timeline() RETURNS integer
    LANGUAGE sql
    SET search_path FROM CURRENT
    AS $$
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

-- Whether the ledger is still what the calling process saw of it (migration 0017): its
-- newest epoch, the server's timeline and WAL positions, and `ok` when the epoch is not
-- older than the one seen, the timeline is the epoch's, and on the timeline seen the WAL
-- has not gone back behind what was durable then (the flush position seen: a crash
-- recovers at least that far; only a restore or a standby that was behind is earlier).
-- Every claim and outcome statement asks it; without `p_wal` (a server that does not let
-- its WAL position be read) it checks nothing.
CREATE FUNCTION opledger_epoch_check(
    p_seen_epoch bigint, p_seen_timeline integer, p_seen_lsn pg_lsn, p_wal boolean
)
    RETURNS TABLE(epoch bigint, timeline integer, flushed text, ok boolean)
    LANGUAGE sql
    SET search_path FROM CURRENT
    AS $$
SELECT e.epoch, t.tli, t.flushed::text,
       NOT p_wal
       OR (e.timeline IS NOT DISTINCT FROM t.tli
           AND e.epoch >= p_seen_epoch
           AND (e.epoch > p_seen_epoch OR t.tli IS DISTINCT FROM p_seen_timeline
                OR t.here >= p_seen_lsn))
FROM (SELECT l.epoch, l.timeline FROM ledger_epochs AS l ORDER BY l.epoch DESC LIMIT 1) AS e
CROSS JOIN (
    SELECT CASE WHEN p_wal THEN opledger_timeline() END AS tli,
           CASE WHEN p_wal THEN pg_current_wal_insert_lsn() END AS here,
           CASE WHEN p_wal THEN pg_current_wal_flush_lsn() END AS flushed
) AS t
$$;

-- Whether a prepared operation's first claim must not be taken (migration 0017): it was
-- prepared before the newest switch's suspicion window ended, or its intent has a provider
-- answer the ledger forgot (an orphan receipt): an earlier ask of its act may have been
-- sent. Such an operation is quarantined instead of claimed, once it can be claimed (one
-- still waiting on its dependencies stays prepared, so they can release or cancel it).
CREATE FUNCTION opledger_suspect(p_op_id text) RETURNS boolean
    LANGUAGE sql
    SET search_path FROM CURRENT
    AS $$
SELECT EXISTS (
    SELECT 1 FROM operations AS s
    WHERE s.id = p_op_id AND s.status = 'prepared' AND s.waiting_on = 0
      AND (s.created_at < (SELECT max(l.suspect_until) FROM ledger_epochs AS l)
           OR EXISTS (SELECT 1 FROM orphan_receipts AS r
                      WHERE r.matched_op_id IS NULL AND r.forgotten
                        AND r.tenant = s.tenant AND r.workflow_id = s.workflow_id
                        AND r.intent_key = s.intent_key))
)
$$;

-- Quarantine after a switch (migration 0017): every open operation (`p_op_id` NULL), or one
-- prepared operation asked while the ledger may have forgotten an earlier ask of its act,
-- goes to `unknown` with its fence raised to the switch's floor and one attempt more, an
-- attempt the ledger may have forgotten: sent under the operation's key at some time after
-- its last change the ledger kept, perhaps still in flight until `p_holds` (per provider,
-- seconds) or `p_hold` from now. The retry decision then reads it like any attempt whose
-- outcome is unknown: the provider's evidence decides, else a person. Forgotten orphan
-- receipts of these operations (by id or by intent) become their evidence.
CREATE FUNCTION opledger_quarantine(
    p_op_id text, p_epoch bigint, p_by text, p_holds jsonb, p_hold interval
)
    RETURNS integer
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
DECLARE
    e ledger_epochs%ROWTYPE;
    why text;
    moved integer;
BEGIN
    SELECT * INTO e FROM ledger_epochs WHERE epoch = p_epoch;
    IF p_op_id IS NULL THEN
        why := format('ledger switch #%s (%s): the ledger may have forgotten an attempt of '
                      'this operation; the provider''s evidence decides', e.epoch, e.reason);
    ELSE
        why := format('asked while the ledger may have forgotten an earlier ask of this act '
                      '(ledger switch #%s, %s); the provider''s evidence decides',
                      e.epoch, e.reason);
    END IF;
    WITH held AS (
        SELECT o.id, o.updated_at,
               coalesce((SELECT max(a.n) FROM attempts AS a WHERE a.op_id = o.id), 0) + 1 AS n,
               -- the longest a real attempt of it was allowed to take (its provider's send
               -- window and in-flight time, as its claim measured them)
               (SELECT max(a.deadline_at - a.started_at) FROM attempts AS a
                WHERE a.op_id = o.id AND a.claim_token NOT LIKE 'ledger-switch-%') AS took
        FROM operations AS o
        WHERE (p_op_id IS NULL OR o.id = p_op_id)
          AND ((p_op_id IS NULL AND o.status IN ('dispatching', 'unknown'))
               OR (o.status = 'prepared' AND o.waiting_on = 0))
        ORDER BY o.id
        FOR UPDATE OF o
    ),
    op AS (
        UPDATE operations AS o
        SET status = 'unknown', fence = greatest(o.fence + 1, e.fence_floor),
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_check_at = now(), operator_retry_by = NULL,
            changed_by = p_by, change_reason = left(why, 500),
            record_version = o.record_version + 1, updated_at = now()
        FROM held
        WHERE o.id = held.id
        RETURNING o.id, o.fence, o.provider, o.idempotency_key, held.n, held.updated_at AS since,
                  held.took
    ),
    attempt AS (
        INSERT INTO attempts (
            op_id, n, fence, owner, claim_token, idempotency_key, started_at, deadline_at,
            finished_at, outcome, response
        )
        SELECT op.id, op.n, op.fence, p_by, 'ledger-switch-' || e.epoch, op.idempotency_key,
               op.since,
               now() + greatest(
                   coalesce(
                       make_interval(secs => (p_holds ->> op.provider)::double precision), p_hold),
                   op.took),
               now(), 'ambiguous',
               jsonb_build_object('kind', 'ambiguous', 'code', 'ledger_switch',
                                  'reason', why, 'detail', jsonb_build_object('switch', e.epoch))
        FROM op
    ),
    noted AS (
        INSERT INTO evidence (op_id, attempt_n, fence, source, verdict, binding, detail, applied)
        SELECT op.id, op.n, op.fence, 'dispatch', 'ambiguous',
               jsonb_build_object('idempotency_key', op.idempotency_key),
               jsonb_build_object('code', 'ledger_switch', 'reason', why, 'switch', e.epoch,
                                  'timeline', e.timeline,
                                  'previous_timeline', e.previous_timeline),
               false
        FROM op
    )
    SELECT count(*) INTO moved FROM op;
    WITH tied AS (
        UPDATE orphan_receipts AS r SET matched_op_id = o.id, matched_at = now()
        FROM operations AS o
        WHERE r.matched_op_id IS NULL AND r.forgotten
          AND (r.op_id = o.id
               OR (r.tenant = o.tenant AND r.workflow_id = o.workflow_id
                   AND r.intent_key = o.intent_key))
          AND (p_op_id IS NULL OR o.id = p_op_id)
          AND o.status <> 'prepared'
        RETURNING r.id, r.verdict, r.binding, r.detail, r.fence, r.received_at, o.id AS to_op
    )
    INSERT INTO evidence (op_id, attempt_n, fence, source, verdict, binding, detail, applied)
    SELECT tied.to_op, NULL, tied.fence, 'dispatch', tied.verdict, tied.binding,
           tied.detail || jsonb_build_object(
               'orphan_receipt', tied.id,
               'received_at', tied.received_at,
               'orphan', 'the provider''s answer to a claim the ledger forgot'),
           false
    FROM tied;
    RETURN moved;
END;
$$;

-- A switch, recorded once (migration 0017): whether the ledger now runs on another timeline
-- than its last epoch says, or is behind what the calling process saw of it (an older
-- epoch, or its WAL position back on the same timeline: a restore). If so, a new epoch is
-- recorded, with its fence floor and its suspicion window, and every open operation is
-- quarantined (`opledger_quarantine`); either way the newest epoch is returned. A promotion
-- the caller knows lost nothing (`p_lossless`: every claim waited for the synchronous
-- standby that was promoted) is recorded, and nothing is quarantined.
CREATE FUNCTION opledger_switch(
    p_by text, p_seen_epoch bigint, p_seen_timeline integer, p_seen_lsn pg_lsn,
    p_holds jsonb, p_hold interval, p_suspect interval, p_lossless boolean
)
    RETURNS SETOF ledger_epochs
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
DECLARE
    last ledger_epochs%ROWTYPE;
    tli integer := opledger_timeline();
    here pg_lsn := pg_current_wal_insert_lsn();
    what text;
    why text;
    made ledger_epochs%ROWTYPE;
BEGIN
    LOCK TABLE ledger_epochs IN SHARE ROW EXCLUSIVE MODE;
    SELECT * INTO last FROM ledger_epochs ORDER BY epoch DESC LIMIT 1;
    IF last.timeline IS NULL THEN  -- not read when the ledger was made: adopted, no switch
        UPDATE ledger_epochs SET timeline = tli WHERE epoch = last.epoch;
        RETURN QUERY SELECT * FROM ledger_epochs WHERE epoch = last.epoch;
        RETURN;
    ELSIF last.timeline IS DISTINCT FROM tli THEN
        what := 'timeline';
        why := format('the server writes on timeline %s, the ledger last ran on timeline %s',
                      tli, last.timeline);
    ELSIF p_seen_epoch IS NOT NULL AND last.epoch < p_seen_epoch THEN
        what := 'rewind';
        why := format('the ledger is back at epoch %s, a process had seen epoch %s',
                      last.epoch, p_seen_epoch);
    ELSIF p_seen_epoch IS NOT NULL AND last.epoch = p_seen_epoch AND p_seen_timeline = tli
          AND here < p_seen_lsn THEN
        what := 'rewind';
        why := format('the server''s WAL is back at %s on timeline %s, a process had seen %s',
                      here, tli, p_seen_lsn);
    ELSE
        RETURN QUERY SELECT last.*;
        RETURN;
    END IF;
    INSERT INTO ledger_epochs (
        epoch, kind, timeline, previous_timeline, lsn, seen_lsn, detected_by, reason,
        fence_floor, suspect_until
    )
    VALUES (
        greatest(last.epoch, coalesce(p_seen_epoch, 0)) + 1, what, tli, last.timeline,
        here::text, p_seen_lsn::text, p_by, why,
        greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                 (SELECT max(fence_floor) + 1 FROM ledger_epochs)),
        now() + p_suspect
    )
    RETURNING * INTO made;
    IF p_lossless AND what = 'timeline' THEN
        UPDATE ledger_epochs
        SET suspect_until = NULL,
            reason = reason || '; nothing quarantined: every claim waited for a synchronous '
                               'standby (OPLEDGER_REQUIRE_SYNC_STANDBY)'
        WHERE epoch = made.epoch;
    ELSE
        UPDATE ledger_epochs
        SET quarantined = opledger_quarantine(NULL, made.epoch, p_by, p_holds, p_hold)
        WHERE epoch = made.epoch;
    END IF;
    RETURN QUERY SELECT * FROM ledger_epochs WHERE epoch = made.epoch;
END;
$$;
"""

GUARD = """
CREATE OR REPLACE FUNCTION opledger_guard_operation() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
BEGIN
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'fence of % cannot go back from % to %', OLD.id, OLD.fence, NEW.fence
            USING ERRCODE = 'OL002';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
        (OLD.status, NEW.status) IN (
            ('prepared', 'dispatching'), ('prepared', 'cancelled'),
            ('prepared', 'unknown'),
            ('dispatching', 'confirmed'), ('dispatching', 'rejected'),
            ('dispatching', 'unknown'),
            ('unknown', 'confirmed'), ('unknown', 'rejected'),
            ('unknown', 'dispatching'), ('unknown', 'cancelled')
        )
    ) THEN
        RAISE EXCEPTION 'operation % cannot move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'OL001';
    END IF;
    IF NEW.changed_by IS NULL OR NEW.change_reason IS NULL
       OR (NEW.changed_by IS NOT DISTINCT FROM OLD.changed_by
           AND NEW.change_reason IS NOT DISTINCT FROM OLD.change_reason) THEN
        RAISE EXCEPTION 'the change of % to % (fence %) does not say who made it and why',
            OLD.id, NEW.status, NEW.fence
            USING ERRCODE = 'OL003';
    END IF;
    INSERT INTO transitions (op_id, from_status, to_status, fence, actor, reason)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.fence, NEW.changed_by, NEW.change_reason);
    RETURN NEW;
END;
$$;
"""

# the guard as it stood before: the same function without prepared -> unknown
PREVIOUS_GUARD = GUARD.replace("\n            ('prepared', 'unknown'),", "", 1)

# Epoch 0: the database the ledger runs on now. A server whose WAL position cannot be read
# (the function is refused) records none; the first switch check then adopts it.
FIRST_EPOCH = """
DO $$
DECLARE
    tli integer;
    here text;
BEGIN
    BEGIN
        tli := opledger_timeline();
        here := pg_current_wal_insert_lsn()::text;
    EXCEPTION WHEN OTHERS THEN
        tli := NULL;
    END;
    INSERT INTO ledger_epochs (epoch, kind, timeline, lsn, detected_by, reason)
    VALUES (0, 'initial', tli, here, 'migrate', 'the database the ledger was migrated on');
    INSERT INTO ledger_identity DEFAULT VALUES;
END;
$$
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(FUNCTIONS)
    op.execute(GUARD)
    op.execute(FIRST_EPOCH)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD)
    op.execute(
        "DROP FUNCTION opledger_switch(text, bigint, integer, pg_lsn, jsonb, interval, interval, "
        "boolean)"
    )
    op.execute("DROP FUNCTION opledger_quarantine(text, bigint, text, jsonb, interval)")
    op.execute("DROP FUNCTION opledger_epoch_check(bigint, integer, pg_lsn, boolean)")
    op.execute("DROP FUNCTION opledger_suspect(text)")
    op.execute("DROP FUNCTION opledger_timeline()")
    op.execute("DROP TABLE orphan_receipts")
    op.execute("DROP TABLE ledger_identity")
    op.execute("DROP TABLE ledger_epochs")
