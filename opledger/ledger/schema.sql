-- The ledger's schema as it stands after every migration, to read in one place.
--
-- The migrations (opledger/ledger/migrations/versions) are the deltas that build it and
-- stay the only way to create or change a database (`opledger migrate`); this file is
-- not applied by anything (only its table names are read: `migrate.ledger_tables()`).
-- tests/integration/test_schema_sql.py loads it into an empty database and checks that
-- it defines exactly what the migrations do: the same tables, columns, constraints,
-- indexes, functions and triggers. A schema change is a migration and the same change
-- here.
--
-- Everything here lives in the ledger's own schema (`opledger` unless
-- OPLEDGER_DATABASE_SCHEMA names another): the names are unqualified, so it is read with
-- `search_path` set to that schema alone, as the migrations run and as every connection
-- of the ledger does. Each trigger function pins the same path (`SET search_path FROM
-- CURRENT`), so it writes into the ledger's tables whichever session fires it; a
-- migration that replaces a function must say so again.
--
-- Contents: the status type; the tables, each with its keys and indexes (in the order
-- they can be created); the functions of the triggers; the triggers.

-- An operation's status: prepared -> dispatching -> confirmed | rejected | unknown;
-- unknown -> confirmed | rejected | dispatching (a retry) | cancelled; prepared ->
-- cancelled; prepared -> unknown (quarantined after a ledger switch). The guard function
-- below holds the same table (models.ALLOWED_TRANSITIONS).

CREATE TYPE op_status AS ENUM (
    'prepared',
    'dispatching',
    'confirmed',
    'rejected',
    'unknown',
    'cancelled'
);


-- == tables ==============================================================================

-- Grants: which actions (scope patterns) a tenant's operations may be written under,
-- until revoked or expired. Every write re-checks its grant.
CREATE TABLE authorizations (
    ref text NOT NULL,
    tenant text NOT NULL,
    scope text[] NOT NULL,
    granted_by text NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    revoked_by text,
    revoke_reason text
);
ALTER TABLE ONLY authorizations ADD CONSTRAINT pk_authorizations PRIMARY KEY (ref);
CREATE INDEX ix_authorizations_tenant ON authorizations USING btree (tenant);

-- The review console's operators: an argon2 hash (or none, for SSO-only accounts) and
-- the tenants each acts for.
CREATE TABLE operators (
    name text NOT NULL,
    password_hash text,
    all_tenants boolean DEFAULT false NOT NULL,
    tenants text[] DEFAULT '{}'::text[] NOT NULL,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    disabled_at timestamp with time zone,
    disabled_by text,
    -- the actions (patterns, as a grant's scope) whose approvals the operator may give (0022)
    approves text[] DEFAULT '{}'::text[] NOT NULL,
    CONSTRAINT ck_operators_has_tenants CHECK ((all_tenants OR (cardinality(tenants) > 0)))
);
ALTER TABLE ONLY operators ADD CONSTRAINT pk_operators PRIMARY KEY (name);

-- The backlog guard's last look at each queue (depth, drain rate), so the relay and the
-- sweep publish only into headroom.
CREATE TABLE queue_guards (
    queue text NOT NULL,
    sampled_at timestamp with time zone,
    depth_after bigint,
    counter bigint,
    drain_per_s double precision DEFAULT 0 NOT NULL,
    shallow_since timestamp with time zone
);
ALTER TABLE ONLY queue_guards ADD CONSTRAINT pk_queue_guards PRIMARY KEY (queue);

-- Server-side console sessions: the cookie's token is kept only as its sha256, with the
-- CSRF token, the expiries and a notice the session's next page shows once (`flash`).
CREATE TABLE console_sessions (
    id text NOT NULL,
    operator text NOT NULL,
    csrf_token text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone,
    flash jsonb
);
ALTER TABLE ONLY console_sessions ADD CONSTRAINT pk_console_sessions PRIMARY KEY (id);
ALTER TABLE ONLY console_sessions
    ADD CONSTRAINT fk_console_sessions_operator_operators FOREIGN KEY (operator)
        REFERENCES operators(name) ON DELETE CASCADE;
CREATE INDEX ix_console_sessions_operator ON console_sessions USING btree (operator);

-- Every password check the console ran: the name as typed (known or not), the client's
-- address, the result. Recent failures per name and per address throttle sign-in.
CREATE TABLE signin_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY,
    at timestamp with time zone DEFAULT now() NOT NULL,
    operator text NOT NULL,
    address text NOT NULL,
    ok boolean NOT NULL
);
ALTER TABLE ONLY signin_attempts ADD CONSTRAINT pk_signin_attempts PRIMARY KEY (id);
CREATE INDEX ix_signin_attempts_address_at ON signin_attempts USING btree (address, at);
CREATE INDEX ix_signin_attempts_operator_at ON signin_attempts USING btree (operator, at);

-- One row per intended external effect, written before anything is sent. Its intent
-- (tenant, workflow_id, intent_key) is unique, and a tenant-wide act's (`intent_scope`
-- 'tenant', 0020) is unique in its tenant; `fence` grows by one on every claim and
-- every controlled write is conditional on it; `status` moves only as the guard trigger
-- below allows. `waiting_on` counts unconfirmed dependencies (the claim takes only 0);
-- `notify_settle` makes its changes NOTIFY opledger_settle.
CREATE TABLE operations (
    id text NOT NULL,
    tenant text NOT NULL,
    workflow_id text NOT NULL,
    intent_key text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    provider text NOT NULL,
    payload_digest text NOT NULL,
    payload_size integer NOT NULL,
    authorization_ref text NOT NULL,
    status op_status DEFAULT 'prepared'::op_status NOT NULL,
    fence bigint DEFAULT 0 NOT NULL,
    lease_owner text,
    lease_token text,
    lease_expires_at timestamp with time zone,
    idempotency_key text NOT NULL,
    provider_result_id text,
    evidence_checked_at timestamp with time zone,
    next_check_at timestamp with time zone,
    record_version integer DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone,
    operator_retry_by text,
    relay_gen integer DEFAULT 0 NOT NULL,
    relay_lost integer DEFAULT 0 NOT NULL,
    check_gen integer DEFAULT 0 NOT NULL,
    changed_by text,
    change_reason text,
    waiting_on integer DEFAULT 0 NOT NULL,
    has_dependents boolean DEFAULT false NOT NULL,
    notify_settle boolean DEFAULT false NOT NULL,
    released_at timestamp with time zone,
    traceparent text,
    intent_scope text DEFAULT 'run'::text NOT NULL,
    CONSTRAINT ck_operations_ck_operations_waiting_nonnegative CHECK ((waiting_on >= 0)),
    CONSTRAINT ck_operations_digest_format CHECK ((payload_digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT ck_operations_fence_nonnegative CHECK ((fence >= 0)),
    CONSTRAINT ck_operations_id_format CHECK ((id ~ '^op_[0-9A-HJKMNP-TV-Z]{26}$'::text)),
    CONSTRAINT ck_operations_intent_scope
        CHECK ((intent_scope = ANY (ARRAY['run'::text, 'tenant'::text]))),
    CONSTRAINT ck_operations_lease_matches_status CHECK (((status = 'unknown'::op_status)
        OR ((status = 'dispatching'::op_status)
            = ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))))
);
ALTER TABLE ONLY operations ADD CONSTRAINT pk_operations PRIMARY KEY (id);
ALTER TABLE ONLY operations
    ADD CONSTRAINT uq_operations_intent UNIQUE (tenant, workflow_id, intent_key);
-- a tenant-wide act, whatever run asked it (0020): its key's form is no run's key's
CREATE UNIQUE INDEX uq_operations_tenant_intent ON operations USING btree (tenant, intent_key)
    WHERE (intent_scope = 'tenant'::text);
ALTER TABLE ONLY operations
    ADD CONSTRAINT fk_operations_authorization_ref_authorizations FOREIGN KEY (authorization_ref)
        REFERENCES authorizations(ref);
CREATE INDEX ix_operations_authorization_ref ON operations USING btree (authorization_ref);
CREATE INDEX ix_operations_due_check ON operations USING btree (next_check_at)
    WHERE (status = 'unknown'::op_status);
CREATE INDEX ix_operations_prepared ON operations USING btree (created_at)
    WHERE (status = 'prepared'::op_status);
CREATE INDEX ix_operations_stale_lease ON operations USING btree (lease_expires_at)
    WHERE (status = 'dispatching'::op_status);
-- the operations deferred for their provider's room, by provider and age (0019)
CREATE INDEX ix_operations_waiting_room ON operations USING btree (provider, created_at)
    WHERE ((status = 'prepared'::op_status) AND (next_check_at IS NOT NULL));
CREATE INDEX ix_operations_tenant_status ON operations USING btree (tenant, status);

-- One row per claim: written before the provider call (with its send-by and in-flight
-- deadline), closed with the outcome.
CREATE TABLE attempts (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    n integer NOT NULL,
    fence bigint NOT NULL,
    owner text NOT NULL,
    claim_token text NOT NULL,
    idempotency_key text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    deadline_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    response jsonb,
    authorized_by text,
    send_by timestamp with time zone,
    CONSTRAINT ck_attempts_outcome_kind CHECK (((outcome IS NULL)
        OR (outcome = ANY (ARRAY['confirmed'::text, 'rejected'::text, 'ambiguous'::text]))))
);
ALTER TABLE ONLY attempts ADD CONSTRAINT pk_attempts PRIMARY KEY (id);
ALTER TABLE ONLY attempts ADD CONSTRAINT uq_attempts_op_fence UNIQUE (op_id, fence);
ALTER TABLE ONLY attempts ADD CONSTRAINT uq_attempts_op_n UNIQUE (op_id, n);
ALTER TABLE ONLY attempts
    ADD CONSTRAINT fk_attempts_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;

-- Every fact learned about an operation (a provider answer, a lookup, a late answer of a
-- fenced-out worker); `applied` says whether it moved the status. Never deleted.
CREATE TABLE evidence (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    attempt_n integer,
    fence bigint,
    source text NOT NULL,
    verdict text NOT NULL,
    binding jsonb DEFAULT '{}'::jsonb NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    applied boolean NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE ONLY evidence ADD CONSTRAINT pk_evidence PRIMARY KEY (id);
ALTER TABLE ONLY evidence
    ADD CONSTRAINT fk_evidence_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_evidence_op_id ON evidence USING btree (op_id);

-- Who asked for each intent of an agent's effect (Ledger.ask): the tool-call or request
-- id, and what a later ask asked differently (never sent).
CREATE TABLE intent_asks (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    asked_at timestamp with time zone DEFAULT now() NOT NULL,
    asked_by text,
    actor text NOT NULL,
    payload_digest text NOT NULL,
    authorization_ref text NOT NULL,
    differs text[] DEFAULT '{}'::text[] NOT NULL
);
ALTER TABLE ONLY intent_asks ADD CONSTRAINT pk_intent_asks PRIMARY KEY (id);
ALTER TABLE ONLY intent_asks
    ADD CONSTRAINT fk_intent_asks_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_intent_asks_op_id ON intent_asks USING btree (op_id);

-- Ordered effects: an operation runs only after each operation it names is confirmed.
CREATE TABLE operation_deps (
    op_id text NOT NULL,
    dep_id text NOT NULL
);
ALTER TABLE ONLY operation_deps ADD CONSTRAINT pk_operation_deps PRIMARY KEY (op_id, dep_id);
ALTER TABLE ONLY operation_deps
    ADD CONSTRAINT fk_operation_deps_dep_id_operations FOREIGN KEY (dep_id)
        REFERENCES operations(id);
ALTER TABLE ONLY operation_deps
    ADD CONSTRAINT fk_operation_deps_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_operation_deps_dep_id ON operation_deps USING btree (dep_id);

-- A provider's concurrency limit as rows, one per call that may be in flight at once: a
-- claim takes a free one and holds it until the call answers (or, when its answer was
-- lost, until its in-flight deadline).
CREATE TABLE provider_slots (
    provider text NOT NULL,
    slot integer NOT NULL,
    held_until timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    claim_token text,
    op_id text
);
ALTER TABLE ONLY provider_slots ADD CONSTRAINT pk_provider_slots PRIMARY KEY (provider, slot);

-- A provider's rate bucket (GCRA: `tat`, the theoretical arrival time), its consecutive
-- refusals to connect, its breaker, and the pause that holds claims back (a Retry-After,
-- an open breaker's next probe) with its reason and since when.
CREATE TABLE provider_pressure (
    provider text NOT NULL,
    tat timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    breaker text DEFAULT 'closed'::text NOT NULL,
    probes integer DEFAULT 0 NOT NULL,
    paused_until timestamp with time zone,
    paused_since timestamp with time zone,
    pause_reason text,
    probe_token text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_provider_pressure_breaker CHECK ((breaker = ANY (ARRAY['closed'::text, 'open'::text])))
);
ALTER TABLE ONLY provider_pressure ADD CONSTRAINT pk_provider_pressure PRIMARY KEY (provider);

-- The frozen canonical payload (RFC 8785), apart from the operation so it can be purged
-- after retention while the digest stays.
-- Either in clear (`canonical`; rows written before a key was configured) or sealed under
-- `key_id` (AES-256-GCM bound to the operation's id; opledger.ledger.payload_keys).
CREATE TABLE operation_payloads (
    op_id text NOT NULL,
    canonical text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    key_id text,
    sealed bytea,
    CONSTRAINT ck_operation_payloads_sealed_or_clear CHECK (
        (key_id IS NULL AND sealed IS NULL AND canonical IS NOT NULL)
        OR (key_id IS NOT NULL AND sealed IS NOT NULL AND canonical IS NULL))
);
ALTER TABLE ONLY operation_payloads ADD CONSTRAINT pk_operation_payloads PRIMARY KEY (op_id);
ALTER TABLE ONLY operation_payloads
    ADD CONSTRAINT fk_operation_payloads_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;

-- What no evidence could decide, for a person: at most one open review per operation;
-- the snapshot of what was attempted and what a retry could cause.
CREATE TABLE reviews (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    reason text NOT NULL,
    opened_at timestamp with time zone DEFAULT now() NOT NULL,
    snapshot jsonb DEFAULT '{}'::jsonb NOT NULL,
    resolution text,
    resolved_by text,
    resolved_at timestamp with time zone,
    note text,
    notified_at timestamp with time zone,
    notify_due_at timestamp with time zone
);
ALTER TABLE ONLY reviews ADD CONSTRAINT pk_reviews PRIMARY KEY (id);
ALTER TABLE ONLY reviews
    ADD CONSTRAINT fk_reviews_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_reviews_op_id ON reviews USING btree (op_id);
CREATE INDEX ix_reviews_to_notify ON reviews USING btree (notify_due_at)
    WHERE ((notified_at IS NULL) AND (resolved_at IS NULL));
CREATE UNIQUE INDEX uq_reviews_one_open ON reviews USING btree (op_id) WHERE (resolved_at IS NULL);

-- The audit trail of every status and fence change, written by the guard trigger itself
-- (no statement writes a row here).
CREATE TABLE transitions (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    from_status op_status,
    to_status op_status NOT NULL,
    fence bigint NOT NULL,
    actor text NOT NULL,
    reason text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE ONLY transitions ADD CONSTRAINT pk_transitions PRIMARY KEY (id);
ALTER TABLE ONLY transitions
    ADD CONSTRAINT fk_transitions_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_transitions_op_id ON transitions USING btree (op_id);

-- Every operator action on a review (resolutions, refusals), the audit trail of the
-- review queue.
CREATE TABLE review_actions (
    id bigint GENERATED ALWAYS AS IDENTITY,
    review_id bigint NOT NULL,
    op_id text NOT NULL,
    tenant text NOT NULL,
    operator text NOT NULL,
    resolution text NOT NULL,
    note text NOT NULL,
    evidence text,
    new_key text,
    fence bigint NOT NULL,
    shown jsonb NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    override_evidence boolean DEFAULT false NOT NULL,
    risk_acknowledged boolean DEFAULT false NOT NULL,
    -- acknowledged (0021): the review of a settled operation (a possible duplicate), which
    -- moves nothing
    CONSTRAINT ck_review_actions_resolution_kind CHECK ((resolution = ANY (
        ARRAY['confirmed'::text, 'rejected'::text, 'retry'::text, 'cancel'::text,
              'acknowledged'::text])))
);
ALTER TABLE ONLY review_actions ADD CONSTRAINT pk_review_actions PRIMARY KEY (id);
ALTER TABLE ONLY review_actions
    ADD CONSTRAINT fk_review_actions_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
ALTER TABLE ONLY review_actions
    ADD CONSTRAINT fk_review_actions_review_id_reviews FOREIGN KEY (review_id)
        REFERENCES reviews(id) ON DELETE CASCADE;
CREATE INDEX ix_review_actions_op_id ON review_actions USING btree (op_id);

-- What an operator was shown, so a resolution from a stale view is refused.
CREATE TABLE review_views (
    id bigint GENERATED ALWAYS AS IDENTITY,
    review_id bigint NOT NULL,
    operator text NOT NULL,
    record_version integer NOT NULL,
    shown jsonb NOT NULL,
    shown_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE ONLY review_views ADD CONSTRAINT pk_review_views PRIMARY KEY (id);
ALTER TABLE ONLY review_views
    ADD CONSTRAINT fk_review_views_review_id_reviews FOREIGN KEY (review_id)
        REFERENCES reviews(id) ON DELETE CASCADE;
CREATE INDEX ix_review_views_review_operator ON review_views USING btree (review_id, operator);

-- Approvals (0022): an act its action's policy asks a person (or two) to approve, bound to
-- its operation, the frozen payload's digest and the grant; it holds the operation
-- (`waiting_on` + 1) until approved, and the first claim consumes it (`consumed_at`,
-- `consumed_fence`). `approval_decisions`: every decision, with the digest and the payload
-- (secrets hidden) the operator was shown.
CREATE TABLE approvals (
    op_id text NOT NULL,
    tenant text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    payload_digest text NOT NULL,
    authorization_ref text NOT NULL,
    requested_by text NOT NULL,
    asked_by text,
    reasons text[] DEFAULT '{}'::text[] NOT NULL,
    approvers_required smallint NOT NULL,
    approved_by text[] DEFAULT '{}'::text[] NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    decided_by text,
    consumed_at timestamp with time zone,
    consumed_fence bigint,
    -- its `approval.requested` notification prepared (0023), and when the sweep may hand
    -- it out again until then
    notified_at timestamp with time zone,
    notify_due_at timestamp with time zone,
    CONSTRAINT ck_approvals_status CHECK ((status = ANY (ARRAY['pending'::text,
        'approved'::text, 'denied'::text, 'expired'::text]))),
    CONSTRAINT ck_approvals_approvers CHECK (((approvers_required >= 1)
        AND (approvers_required <= 2))),
    CONSTRAINT ck_approvals_consumed_once CHECK (((consumed_at IS NULL)
        = (consumed_fence IS NULL))),
    CONSTRAINT ck_approvals_consumed_approved CHECK (((consumed_at IS NULL)
        OR (status = 'approved'::text)))
);
ALTER TABLE ONLY approvals ADD CONSTRAINT pk_approvals PRIMARY KEY (op_id);
ALTER TABLE ONLY approvals
    ADD CONSTRAINT fk_approvals_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_approvals_pending ON approvals USING btree (tenant, requested_at)
    WHERE (status = 'pending'::text);
CREATE INDEX ix_approvals_expiring ON approvals USING btree (expires_at)
    WHERE (status = 'pending'::text);
CREATE INDEX ix_approvals_unnotified ON approvals USING btree (requested_at)
    WHERE ((notified_at IS NULL) AND (status = 'pending'::text));

CREATE TABLE approval_decisions (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    tenant text NOT NULL,
    operator text NOT NULL,
    decision text NOT NULL,
    payload_digest text NOT NULL,
    authorization_ref text NOT NULL,
    shown jsonb NOT NULL,
    note text,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_approval_decisions_decision CHECK ((decision = ANY (ARRAY['approved'::text,
        'denied'::text])))
);
ALTER TABLE ONLY approval_decisions ADD CONSTRAINT pk_approval_decisions PRIMARY KEY (id);
ALTER TABLE ONLY approval_decisions
    ADD CONSTRAINT fk_approval_decisions_op_id_approvals FOREIGN KEY (op_id)
        REFERENCES approvals(op_id) ON DELETE CASCADE;
CREATE INDEX ix_approval_decisions_op_id ON approval_decisions USING btree (op_id);

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

-- The beat's heartbeat (migration 0018): one row, written by the running beat's scheduler
-- loop every few seconds; `seen_at` is the database's time of its last tick. No row: no
-- beat has run against this ledger (or not since the row was removed).
CREATE TABLE beat_heartbeat (
    id integer DEFAULT 1 NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_beat_heartbeat_one_row CHECK ((id = 1))
);
ALTER TABLE ONLY beat_heartbeat ADD CONSTRAINT pk_beat_heartbeat PRIMARY KEY (id);

-- == trigger functions ===================================================================

-- Records an operation's creation in `transitions` (the AFTER INSERT trigger below).
CREATE FUNCTION opledger_audit_transition() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
BEGIN
    INSERT INTO transitions (op_id, from_status, to_status, fence, actor, reason)
    VALUES (
        NEW.id,
        CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
        NEW.status,
        NEW.fence,
        coalesce(NEW.changed_by, 'unknown'),
        coalesce(NEW.change_reason, NEW.status::text)
    );
    RETURN NULL;
END;
$$;

-- When an operation with dependents becomes final: counts `waiting_on` down on its
-- dependents (confirmed), or cancels the prepared ones with its reason (rejected,
-- cancelled).
CREATE FUNCTION opledger_dependency_settled() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
BEGIN
    IF NEW.status = 'confirmed' THEN
        UPDATE operations AS o
        SET waiting_on = o.waiting_on - 1,
            released_at = CASE WHEN o.waiting_on = 1 THEN now() ELSE o.released_at END,
            updated_at = now()
        FROM operation_deps AS d
        WHERE d.dep_id = NEW.id AND o.id = d.op_id AND o.status = 'prepared';
    ELSE
        UPDATE operations AS o
        SET status = 'cancelled', fence = o.fence + 1, next_check_at = NULL,
            released_at = NULL,
            changed_by = 'dependency',
            change_reason = format('dependency %s was %s (%s)', NEW.id, NEW.status,
                                   coalesce(NEW.change_reason, 'no reason given')),
            record_version = o.record_version + 1, updated_at = now()
        FROM operation_deps AS d
        WHERE d.dep_id = NEW.id AND o.id = d.op_id AND o.status = 'prepared';
    END IF;
    RETURN NULL;
END;
$$;

-- The guard: refuses a status change the state machine does not allow, a fence that goes
-- back, and a change whose who and why (`changed_by`, `change_reason`) are missing or
-- repeat the previous change's (the sign of a statement that forgot to set them); writes
-- the transition row of every change it lets through, in the same call.
CREATE FUNCTION opledger_guard_operation() RETURNS trigger
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

-- NOTIFY opledger_settle when a review opens on an operation an agent waits on.
CREATE FUNCTION opledger_notify_review() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
BEGIN
    PERFORM pg_notify('opledger_settle', o.id)
    FROM operations AS o
    WHERE o.id = NEW.op_id AND (o.notify_settle OR o.has_dependents);
    RETURN NULL;
END;
$$;

-- NOTIFY opledger_settle, in the transaction that makes it, when a watched operation (or
-- one with dependents) changes status (but to dispatching) or its count of unconfirmed
-- dependencies changes (the payload is the operation's id).
CREATE FUNCTION opledger_notify_settle() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
    AS $$
BEGIN
    PERFORM pg_notify('opledger_settle', NEW.id);
    RETURN NULL;
END;
$$;

-- == provider pressure ===================================================================

-- Called by the claim statement before it takes an operation: a paused provider, a full
-- set of slots or an empty rate bucket refuse the claim with how long to wait and why (for
-- full slots: until the first frees on its own, at its call's in-flight deadline; a call
-- answering sooner gives its slot back and wakes a waiting operation, 0019).
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
                greatest(extract(epoch FROM next_at - clock_timestamp()), 0.01)
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

-- Called by the outcome statement: a refused connection counts toward the provider's
-- breaker, a "not now" pauses the provider, an answer closes the breaker. `p_token`: the
-- call's claim token (NULL from a statement that names none: read as the probe's).
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

-- == triggers ===========================================================================

-- an operation's creation, and every status or fence change, in `transitions`
CREATE TRIGGER opledger_audit_created AFTER INSERT ON operations
    FOR EACH ROW EXECUTE FUNCTION opledger_audit_transition();
CREATE TRIGGER opledger_guard_operation BEFORE UPDATE OF status, fence ON operations
    FOR EACH ROW
    WHEN (((old.status IS DISTINCT FROM new.status) OR (old.fence IS DISTINCT FROM new.fence)))
    EXECUTE FUNCTION opledger_guard_operation();

-- ordered effects: a final operation releases or cancels what runs after it
CREATE TRIGGER opledger_dependency_settled AFTER UPDATE OF status ON operations
    FOR EACH ROW
    WHEN ((new.has_dependents AND (old.status IS DISTINCT FROM new.status)
           AND (new.status = ANY (ARRAY['confirmed'::op_status, 'rejected'::op_status,
                                        'cancelled'::op_status]))))
    EXECUTE FUNCTION opledger_dependency_settled();

-- what a waiting agent LISTENs for
CREATE TRIGGER opledger_notify_settle AFTER UPDATE OF status, waiting_on ON operations
    FOR EACH ROW
    WHEN (((new.notify_settle OR new.has_dependents)
           AND ((old.status IS DISTINCT FROM new.status)
                OR (old.waiting_on IS DISTINCT FROM new.waiting_on))
           AND (new.status <> 'dispatching'::op_status)))
    EXECUTE FUNCTION opledger_notify_settle();
CREATE TRIGGER opledger_notify_review AFTER INSERT ON reviews
    FOR EACH ROW EXECUTE FUNCTION opledger_notify_review();
