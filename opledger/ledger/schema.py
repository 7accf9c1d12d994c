"""The ledger's tables, as SQLAlchemy Core metadata (the migrations must match it)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from .models import Status

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

op_status = Enum(
    Status,
    name="op_status",
    values_callable=lambda enum: [member.value for member in enum],
    validate_strings=True,
)


authorizations = Table(
    "authorizations",
    metadata,
    Column("ref", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("scope", ARRAY(Text), nullable=False),
    Column("granted_by", Text, nullable=False),
    Column("granted_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    Column("revoked_by", Text),
    Column("revoke_reason", Text),
)
Index("ix_authorizations_tenant", authorizations.c.tenant)

operations = Table(
    "operations",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("workflow_id", Text, nullable=False),
    Column("intent_key", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("payload_digest", Text, nullable=False),
    Column("payload_size", Integer, nullable=False),
    Column(
        "authorization_ref",
        Text,
        ForeignKey("authorizations.ref"),
        nullable=False,
    ),
    Column("status", op_status, nullable=False, server_default=Status.PREPARED.value),
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_owner", Text),
    Column("lease_token", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("idempotency_key", Text, nullable=False),
    Column("provider_result_id", Text),
    Column("evidence_checked_at", DateTime(timezone=True)),
    Column("next_check_at", DateTime(timezone=True)),
    Column("enqueued_at", DateTime(timezone=True)),
    # Publish generations: how often the relay re-published it, how many checks were
    # handed to reconcile. Carried in the message, so a superseded duplicate is dropped.
    Column("relay_gen", Integer, nullable=False, server_default=text("0")),
    # Re-publications of a message presumed lost since its last publish that was due (a
    # provider's wait ended, a dependency was confirmed): each doubles the relay's wait (0016)
    Column("relay_lost", Integer, nullable=False, server_default=text("0")),
    Column("check_gen", Integer, nullable=False, server_default=text("0")),
    Column("operator_retry_by", Text),
    # Who made the last status or fence change, and why: the audit trigger copies them
    # into `transitions` (schema.sql); the guard refuses a change without them.
    Column("changed_by", Text),
    Column("change_reason", Text),
    Column("record_version", Integer, nullable=False, server_default=text("1")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Ordered effects (migration 0008): how many of the operations it runs after are not
    # confirmed yet (the claim takes only 0); whether others run after it; when its last
    # dependency was confirmed (the relay publishes it then). Kept by a trigger.
    Column("waiting_on", Integer, nullable=False, server_default=text("0")),
    Column("has_dependents", Boolean, nullable=False, server_default=text("false")),
    Column("released_at", DateTime(timezone=True)),
    # An agent waits on it: status changes and reviews are NOTIFYed on `opledger_settle`.
    Column("notify_settle", Boolean, nullable=False, server_default=text("false")),
    # The trace context of the code that prepared it (migration 0010): opaque to the ledger,
    # kept so a worker's spans can link back to the trace that recorded the intent.
    Column("traceparent", Text),
    UniqueConstraint("tenant", "workflow_id", "intent_key", name="uq_operations_intent"),
    CheckConstraint("waiting_on >= 0", name="waiting_nonnegative"),
    CheckConstraint("id ~ '^op_[0-9A-HJKMNP-TV-Z]{26}$'", name="id_format"),
    CheckConstraint("payload_digest ~ '^[0-9a-f]{64}$'", name="digest_format"),
    CheckConstraint("fence >= 0", name="fence_nonnegative"),
    # Only a claim holds a lease: always while dispatching, while reconciling an unknown one.
    CheckConstraint(
        "status = 'unknown'"
        " OR (status = 'dispatching') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="lease_matches_status",
    ),
)
# What the sweeps look for; each index holds only the rows of one status.
Index(
    "ix_operations_stale_lease",
    operations.c.lease_expires_at,
    postgresql_where=text("status = 'dispatching'"),
)
Index(
    "ix_operations_due_check",
    operations.c.next_check_at,
    postgresql_where=text("status = 'unknown'"),
)
Index(
    "ix_operations_prepared",
    operations.c.created_at,
    postgresql_where=text("status = 'prepared'"),
)
Index("ix_operations_tenant_status", operations.c.tenant, operations.c.status)
Index("ix_operations_authorization_ref", operations.c.authorization_ref)

# An operation (op_id) runs only after each of its dependencies (dep_id) is confirmed.
operation_deps = Table(
    "operation_deps",
    metadata,
    Column(
        "op_id",
        Text,
        ForeignKey("operations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("dep_id", Text, ForeignKey("operations.id"), primary_key=True),
)
Index("ix_operation_deps_dep_id", operation_deps.c.dep_id)

# One row per broker queue the sweeps publish to: the last depth sample, the drain rate
# measured from the samples, and since when the queue has been shallow (backlog guard).
queue_guards = Table(
    "queue_guards",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("sampled_at", DateTime(timezone=True)),
    Column("depth_after", BigInteger),
    Column("counter", BigInteger),
    Column("drain_per_s", Float, nullable=False, server_default=text("0")),
    Column("shallow_since", DateTime(timezone=True)),
)

# Provider pressure (0015, 0016): a provider's concurrency slots, and its rate bucket, breaker
# and pause; read and written by the functions opledger_admit and opledger_press.
provider_slots = Table(
    "provider_slots",
    metadata,
    Column("provider", Text, primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column(
        "held_until",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("'-infinity'::timestamp with time zone"),
    ),
    Column("claim_token", Text),
    Column("op_id", Text),
)

provider_pressure = Table(
    "provider_pressure",
    metadata,
    Column("provider", Text, primary_key=True),
    Column(
        "tat",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("'-infinity'::timestamp with time zone"),
    ),
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("breaker", Text, nullable=False, server_default=text("'closed'")),
    Column("probes", Integer, nullable=False, server_default=text("0")),
    Column("paused_until", DateTime(timezone=True)),
    Column("paused_since", DateTime(timezone=True)),
    Column("pause_reason", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # the claim token of an open breaker's probe in flight (0016)
    Column("probe_token", Text),
    CheckConstraint("breaker IN ('closed', 'open')", name="breaker"),
)

operation_payloads = Table(
    "operation_payloads",
    metadata,
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), primary_key=True),
    Column("canonical", Text),  # clear text: rows written before a key was configured
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("key_id", Text),  # the key `sealed` is encrypted under (opledger.ledger.payload_keys)
    Column("sealed", LargeBinary),
    CheckConstraint(
        "(key_id IS NULL AND sealed IS NULL AND canonical IS NOT NULL)"
        " OR (key_id IS NOT NULL AND sealed IS NOT NULL AND canonical IS NULL)",
        name="sealed_or_clear",
    ),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("n", Integer, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("owner", Text, nullable=False),
    Column("claim_token", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("deadline_at", DateTime(timezone=True), nullable=False),
    #: the claim's send-by instant: no request of this attempt leaves after it
    Column("send_by", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("outcome", Text),
    Column("response", JSONB),
    Column("authorized_by", Text),
    UniqueConstraint("op_id", "n", name="uq_attempts_op_n"),
    UniqueConstraint("op_id", "fence", name="uq_attempts_op_fence"),
    CheckConstraint(
        "outcome IS NULL OR outcome IN ('confirmed', 'rejected', 'ambiguous')",
        name="outcome_kind",
    ),
)

evidence = Table(
    "evidence",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("attempt_n", Integer),
    Column("fence", BigInteger),
    Column("source", Text, nullable=False),
    Column("verdict", Text, nullable=False),
    Column("binding", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("applied", Boolean, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)
Index("ix_evidence_op_id", evidence.c.op_id)

# Who asked for each intent (migration 0011): every ask of an agent's effect, the first one
# that recorded it and each one after (a re-asked model, a lost response asked again), with
# the tool-call or request id of the asker. Evidence of which call asked, never a key.
intent_asks = Table(
    "intent_asks",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("asked_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("asked_by", Text),
    Column("actor", Text, nullable=False),
    Column("payload_digest", Text, nullable=False),
    Column("authorization_ref", Text, nullable=False),
    Column("differs", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
)
Index("ix_intent_asks_op_id", intent_asks.c.op_id)

transitions = Table(
    "transitions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("from_status", op_status),
    Column("to_status", op_status, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)
Index("ix_transitions_op_id", transitions.c.op_id)

reviews = Table(
    "reviews",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("reason", Text, nullable=False),
    Column("opened_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("snapshot", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("resolution", Text),
    Column("resolved_by", Text),
    Column("resolved_at", DateTime(timezone=True)),
    Column("note", Text),
    Column("notified_at", DateTime(timezone=True)),
    Column("notify_due_at", DateTime(timezone=True)),
)
Index("ix_reviews_op_id", reviews.c.op_id)
Index(
    "ix_reviews_to_notify",
    reviews.c.notify_due_at,
    postgresql_where=text("notified_at IS NULL AND resolved_at IS NULL"),
)

# What an operator was shown (`review show`): a resolution must come from the latest view.
review_views = Table(
    "review_views",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("review_id", BigInteger, ForeignKey("reviews.id", ondelete="CASCADE"), nullable=False),
    Column("operator", Text, nullable=False),
    Column("record_version", Integer, nullable=False),
    Column("shown", JSONB, nullable=False),
    Column("shown_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)
Index("ix_review_views_review_operator", review_views.c.review_id, review_views.c.operator)

# The audit trail of resolutions: who, when, why, what they chose and what they were shown.
review_actions = Table(
    "review_actions",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("review_id", BigInteger, ForeignKey("reviews.id", ondelete="CASCADE"), nullable=False),
    Column("op_id", Text, ForeignKey("operations.id", ondelete="CASCADE"), nullable=False),
    Column("tenant", Text, nullable=False),
    Column("operator", Text, nullable=False),
    Column("resolution", Text, nullable=False),
    Column("note", Text, nullable=False),
    Column("evidence", Text),
    Column("new_key", Text),
    Column("fence", BigInteger, nullable=False),
    Column("shown", JSONB, nullable=False),
    #: the resolution contradicts bound evidence on record, and the operator said so
    Column("override_evidence", Boolean, nullable=False, server_default=text("false")),
    #: a retry that could repeat the effect, with the operator's explicit acknowledgement
    Column("risk_acknowledged", Boolean, nullable=False, server_default=text("false")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint(
        "resolution IN ('confirmed', 'rejected', 'retry', 'cancel')", name="resolution_kind"
    ),
)
Index("ix_review_actions_op_id", review_actions.c.op_id)
Index(
    "uq_reviews_one_open",
    reviews.c.op_id,
    unique=True,
    postgresql_where=text("resolved_at IS NULL"),
)

# The review console's operators (migration 0009): an argon2 hash, or none for an account
# that signs in only through a trusted SSO header; the tenants it acts for, or all of them.
operators = Table(
    "operators",
    metadata,
    Column("name", Text, primary_key=True),
    Column("password_hash", Text),
    Column("all_tenants", Boolean, nullable=False, server_default=text("false")),
    Column("tenants", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("disabled_at", DateTime(timezone=True)),
    Column("disabled_by", Text),
    CheckConstraint("all_tenants OR cardinality(tenants) > 0", name="has_tenants"),
)

# Server-side console sessions: the cookie's token is stored only as its sha256.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id", Text, primary_key=True),
    Column("operator", Text, ForeignKey("operators.name", ondelete="CASCADE"), nullable=False),
    Column("csrf_token", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    #: what the session's next page says once (migration 0013)
    Column("flash", JSONB),
)
Index("ix_console_sessions_operator", console_sessions.c.operator)

# Every password check the console ran (migration 0013): the name as typed, known or not,
# the client's address, the result. Recent failures throttle sign-in per name and address.
signin_attempts = Table(
    "signin_attempts",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("operator", Text, nullable=False),
    Column("address", Text, nullable=False),
    Column("ok", Boolean, nullable=False),
)
Index("ix_signin_attempts_operator_at", signin_attempts.c.operator, signin_attempts.c.at)
Index("ix_signin_attempts_address_at", signin_attempts.c.address, signin_attempts.c.at)

# Where the ledger has run (migration 0017): epoch 0 is the database it was migrated on;
# each later one a switch some process saw (another timeline, or a step back), with the
# fence floor open operations were raised to and the window in which asks are not sent
# blind (`opledger.ledger.switches`).
ledger_epochs = Table(
    "ledger_epochs",
    metadata,
    Column("epoch", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", Text, nullable=False),
    Column("timeline", Integer),
    Column("previous_timeline", Integer),
    Column("began_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("lsn", Text),
    Column("seen_lsn", Text),
    Column("detected_by", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("fence_floor", BigInteger, nullable=False, server_default=text("0")),
    Column("quarantined", Integer, nullable=False, server_default=text("0")),
    Column("suspect_until", DateTime(timezone=True)),
    Column("ended_by", Text),
    CheckConstraint("kind IN ('initial', 'timeline', 'rewind')", name="kind"),
)

# The namespace mixed into every idempotency key derived from an intent (migration 0017).
ledger_identity = Table(
    "ledger_identity",
    metadata,
    Column("id", Integer, primary_key=True, server_default=text("1"), autoincrement=False),
    Column("key_namespace", Text, nullable=False, server_default=text("(gen_random_uuid())::text")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("id = 1", name="one_row"),
)

# A provider's answer to a claim the ledger has no record of (migration 0017), kept.
orphan_receipts = Table(
    "orphan_receipts",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("op_id", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("workflow_id", Text, nullable=False),
    Column("intent_key", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("payload_digest", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("attempt_n", Integer),
    Column("claim_epoch", BigInteger),
    Column("ledger_epoch", BigInteger),
    Column("forgotten", Boolean, nullable=False),
    Column("why", Text, nullable=False),
    Column("reported_by", Text, nullable=False),
    Column("verdict", Text, nullable=False),
    Column("binding", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("matched_op_id", Text),
    Column("matched_at", DateTime(timezone=True)),
)
Index(
    "ix_orphan_receipts_intent",
    orphan_receipts.c.tenant,
    orphan_receipts.c.workflow_id,
    orphan_receipts.c.intent_key,
    postgresql_where=text("matched_op_id IS NULL AND forgotten"),
)
Index("ix_orphan_receipts_op_id", orphan_receipts.c.op_id)
