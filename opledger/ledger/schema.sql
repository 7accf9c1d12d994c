-- The ledger's schema as it stands after every migration, to read in one place.
--
-- The migrations (opledger/ledger/migrations/versions) are the deltas that build it and
-- stay the only way to create or change a database (`opledger migrate`); this file is
-- not applied by anything. tests/integration/test_schema_sql.py loads it into an empty
-- database and checks that it defines exactly what the migrations do: the same tables,
-- columns, constraints, indexes, functions and triggers. A schema change is a migration,
-- the same change in opledger/ledger/schema.py, and the same change here.
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
-- cancelled. The guard function below holds the same table (models.ALLOWED_TRANSITIONS).

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
-- (tenant, workflow_id, intent_key) is unique; `fence` grows by one on every claim and
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
    CONSTRAINT ck_operations_ck_operations_waiting_nonnegative CHECK ((waiting_on >= 0)),
    CONSTRAINT ck_operations_digest_format CHECK ((payload_digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT ck_operations_fence_nonnegative CHECK ((fence >= 0)),
    CONSTRAINT ck_operations_id_format CHECK ((id ~ '^op_[0-9A-HJKMNP-TV-Z]{26}$'::text)),
    CONSTRAINT ck_operations_lease_matches_status CHECK (((status = 'unknown'::op_status)
        OR ((status = 'dispatching'::op_status)
            = ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))))
);
ALTER TABLE ONLY operations ADD CONSTRAINT pk_operations PRIMARY KEY (id);
ALTER TABLE ONLY operations
    ADD CONSTRAINT uq_operations_intent UNIQUE (tenant, workflow_id, intent_key);
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
    CONSTRAINT ck_review_actions_resolution_kind CHECK ((resolution = ANY (
        ARRAY['confirmed'::text, 'rejected'::text, 'retry'::text, 'cancel'::text])))
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
-- set of slots or an empty rate bucket refuse the claim with how long to wait and why.
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
