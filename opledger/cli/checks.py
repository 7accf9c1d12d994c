"""Startup checks: what `opledger check` prints, and what `worker` and `beat` verify before
they say ready. Each check is one line: what was checked and, when it fails, what to fix.

Nothing here creates or changes anything: it reads the settings, connects, and queries.
The one exception is `declare=True`, which only the worker's and beat's startup uses: it
declares opledger's queues on RabbitMQ, as those processes do moments later anyway.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from opledger.queues import QUEUES, is_amqp, queues_of
from opledger.settings import Settings, SettingsInvalid, unknown_variables

#: how long one connection attempt may take before the check says it failed
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    #: a warning is reported but does not fail the checks
    warning: bool = False

    def line(self) -> str:
        mark = "ok  " if self.ok else ("warn" if self.warning else "FAIL")
        return f"{mark} {self.name}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks(
    environ: Mapping[str, str] | None = None,
    *,
    broker: bool = True,
    database: bool = True,
    declare: bool = False,
    beat: bool = True,
) -> list[Check]:
    """Every check, in order; a later check that depends on a failed one is skipped.

    With `declare` (the worker's and the beat's startup checks: they declare them anyway
    moments later), opledger's queues are declared on RabbitMQ, so a queue or exchange
    that exists with another type or arguments is one line, not a crash loop. `beat`:
    whether a beat was seen within `OPLEDGER_BEAT_MISSING_AFTER_SECONDS` is checked (not by
    those startup checks: a worker may start before beat, and beat before its first tick)."""
    env = os.environ if environ is None else environ
    return list(_checks(env, broker=broker, database=database, declare=declare, beat=beat))


def _checks(  # noqa: C901
    env: Mapping[str, str],
    *,
    broker: bool,
    database: bool,
    declare: bool = False,
    beat: bool = True,
) -> Iterator[Check]:
    typos = unknown_variables(env)
    if typos:
        yield Check("variables", False, "not settings, a typo? " + ", ".join(typos), True)
    try:
        settings = Settings.from_environ(env)
    except SettingsInvalid as exc:
        yield Check("settings", False, str(exc))
        return
    registry_check, registry = _registry(settings)
    yield registry_check
    yield _consistency(settings, registry)
    yield _payload_keys(settings)
    lease = _lease(settings, registry)
    if lease is not None:
        yield lease
    quorum = _quorum(settings)
    if quorum is not None:
        yield quorum
    yield from _webhook_signing(settings)
    if settings.mcp_clients:
        yield _mcp_clients(settings.mcp_clients, registry)
    if settings.mcp_upstream:
        yield _mcp_upstream(settings.mcp_upstream, registry)
    if settings.smtp_sent_imap_host and (database or broker):
        yield _sent_folder(settings)
    if database:
        if not settings.database_url and not settings.dev:
            yield Check("postgres", False, "OPLEDGER_DATABASE_URL is not set")
        elif settings.database_url:
            engine = _engine(settings.database_url, settings.database_schema)
            try:
                reachable = _postgres(engine)
                yield reachable
                if reachable.ok:
                    schema = _schema(engine, settings.database_url, settings.database_schema)
                    yield schema
                    if schema.ok and registry is not None:
                        yield _actions_served(engine, registry)
                    if schema.ok:
                        yield _replication(engine, settings)
                        yield from _switches(engine, settings.database_schema)
                    yield _beat_lock(engine, settings.database_schema)
                    if schema.ok and beat:
                        yield _beat_seen(engine, settings)
            finally:
                engine.dispose()
    if broker:
        if not settings.broker_url and not settings.dev:
            yield Check("broker", False, "OPLEDGER_BROKER_URL is not set")
        elif settings.broker_url:
            queues: tuple[Any, ...] = ()
            if declare:
                queues = queues_of(settings.rabbitmq_queue_type, settings.broker_url)
            yield _broker(settings.broker_url, queues, settings.rabbitmq_queue_type)


def _registry(settings: Settings) -> tuple[Check, Any]:
    from opledger.adapters.registry import AdaptersInvalid, load_registry

    try:
        registry = load_registry(settings)
    except AdaptersInvalid as invalid:
        exc = invalid.__cause__
        if not isinstance(exc, ValueError) or isinstance(exc, AdaptersInvalid):
            return Check("adapters", False, str(invalid)), None  # names the setting already
        # the factory refused a contract the adapters' settings make inconsistent: say
        # which settings
        detail = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
        if isinstance(exc, ValidationError):
            detail = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        in_flight = settings.provider_in_flight_seconds
        if in_flight is not None and in_flight < settings.provider_timeout_seconds:
            detail = (
                f"OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS ({in_flight:g}) must be at least "
                f"OPLEDGER_PROVIDER_TIMEOUT_SECONDS ({settings.provider_timeout_seconds:g}): "
                "a request may execute as long as we wait for it"
            )
        return Check("adapters", False, f"{settings.adapters}: {detail}"), None
    actions = ", ".join(sorted(registry.actions))
    return Check("adapters", True, f"{len(registry.actions)} actions ({actions})"), registry


def _mcp_clients(path: str, registry: Any) -> Check:
    """The MCP gateway's clients file: readable, well-formed, one token per agent."""
    from opledger.ledger import InvalidInput
    from opledger.mcp.clients import Clients, ClientsInvalid
    from opledger.mcp.tools import tool_names

    try:
        callers = Clients(path).current()
    except ClientsInvalid as exc:
        return Check("mcp clients", False, str(exc))
    if registry is not None:
        try:  # the gateway would refuse to start: two actions named as one tool
            tool_names(registry.actions)
        except InvalidInput as exc:
            return Check("mcp clients", False, str(exc))
    tenants = sorted({c.tenant for c in callers.values()})
    tools = f", {len(registry.actions)} tools" if registry is not None else ""
    detail = f"{len(callers)} agents ({', '.join(tenants) or 'no tenants'}){tools}"
    return Check("mcp clients", True, detail)


def _mcp_upstream(path: str, registry: Any) -> Check:
    """`opledger mcp proxy`'s upstream file, and an adapter for each of its effects."""
    from opledger.adapters.mcp import UpstreamInvalid, load_upstream

    try:
        upstream = load_upstream(path)
    except UpstreamInvalid as exc:
        return Check("mcp upstream", False, str(exc))
    actions = sorted(t.action for t in upstream.effects.values())
    unserved = [a for a in actions if registry is not None and a not in registry.actions]
    if unserved:
        return Check(
            "mcp upstream",
            False,
            f"no adapter serves {', '.join(unserved)}: "
            "OPLEDGER_ADAPTERS=opledger.adapters.mcp:build_registry",
        )
    detail = f"{upstream.url}: {len(actions)} effects, {len(upstream.passthrough)} passed through"
    return Check("mcp upstream", True, detail)


def _lease(settings: Settings, registry: Any) -> Check | None:
    """A lease no longer than a request timeout is safe (the fence and the send window
    hold) but wasteful: the sweeper fences out workers whose call is still running."""
    lease = timedelta(seconds=settings.lease_seconds)
    for action in sorted(registry.actions if registry is not None else ()):
        timeout = registry.adapter_for(action).contract.request_timeout
        if timeout >= lease:
            return Check(
                "lease",
                False,
                f"OPLEDGER_LEASE_SECONDS ({lease.total_seconds():g}) is not longer than "
                f"{action}'s request timeout ({timeout.total_seconds():g} s): safe, but the "
                "sweeper will fence out workers whose call is still running",
                warning=True,
            )
    return None


def _consistency(settings: Settings, registry: Any) -> Check:
    problems = []
    if settings.visibility_timeout_seconds <= settings.task_time_limit_seconds:
        problems.append(
            f"OPLEDGER_VISIBILITY_TIMEOUT_SECONDS ({settings.visibility_timeout_seconds}) must "
            f"exceed OPLEDGER_TASK_TIME_LIMIT_SECONDS ({settings.task_time_limit_seconds}), or "
            "Redis redelivers a task that is still running"
        )
    consumer = settings.broker_consumer_timeout_seconds
    if is_amqp(settings.broker_url) and consumer <= settings.task_time_limit_seconds:
        problems.append(
            f"OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS ({consumer:g}) must exceed "
            f"OPLEDGER_TASK_TIME_LIMIT_SECONDS ({settings.task_time_limit_seconds}), or "
            "RabbitMQ closes the channel of a task that is still running"
        )
    if problems:
        return Check("settings", False, "; ".join(problems))
    return Check("settings", True, "valid and consistent")


def _payload_keys(settings: Settings) -> Check:
    """Whether frozen payloads are encrypted at rest: a warning when they are stored in
    clear. Names the key ids only, never a key."""
    from opledger.ledger.payload_keys import parse_payload_keys

    raw = settings.payload_keys
    keys = parse_payload_keys(raw.get_secret_value()) if raw is not None else None
    if keys is None:
        return Check(
            "payloads",
            False,
            "frozen payloads are stored in clear: set OPLEDGER_PAYLOAD_KEYS to encrypt them",
            warning=True,
        )
    also = f", {len(keys.ids) - 1} older kept for reading" if len(keys.ids) > 1 else ""
    return Check("payloads", True, f"encrypted under key {keys.current}{also}")


def _quorum(settings: Settings) -> Check | None:
    """Quorum queues: a warning where they mean nothing (Redis), or where a message a
    worker reserved could wait past RabbitMQ's consumer_timeout before its task ends."""
    if settings.rabbitmq_queue_type != "quorum":
        return None
    if not is_amqp(settings.broker_url):
        scheme = (settings.broker_url or "").split(":", 1)[0]
        return Check(
            "queues",
            False,
            "OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum has no effect on this broker "
            f"({scheme or 'none configured'}): only RabbitMQ has quorum queues",
            warning=True,
        )
    # No global prefetch on quorum queues: a worker may reserve a message from each of
    # the queues while its processes are busy, so one can wait for a task of each queue
    # before its own runs: (queues + 1) time limits between delivery and ack at worst.
    worst = settings.task_time_limit_seconds * (len(QUEUES) + 1)
    if settings.broker_consumer_timeout_seconds <= worst:
        return Check(
            "queues",
            False,
            f"with quorum queues a reserved message may wait up to {worst} s "
            f"({len(QUEUES) + 1} × OPLEDGER_TASK_TIME_LIMIT_SECONDS) before its ack, not below "
            f"OPLEDGER_BROKER_CONSUMER_TIMEOUT_SECONDS "
            f"({settings.broker_consumer_timeout_seconds:g}): RabbitMQ may close the channel "
            "and redeliver (the fence refuses the second claim, but the work is repeated)",
            warning=True,
        )
    return None


def _webhook_signing(settings: Settings) -> list[Check]:
    """With a review webhook: whether its requests are signed. Unsigned is a warning (the
    receiver cannot tell them from forged ones), never a failure. Names the settings only,
    never a secret's value."""
    if not settings.review_webhook_url:
        return []
    if settings.review_webhook_secret is None:
        return [
            Check(
                "review webhook",
                False,
                "review webhooks are sent unsigned: set OPLEDGER_REVIEW_WEBHOOK_SECRET so the "
                "receiver can verify them (docs/webhooks.md)",
                warning=True,
            )
        ]
    rotating = settings.review_webhook_previous_secret is not None
    also = " and OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET (rotating)" if rotating else ""
    return [Check("review webhook", True, f"signed with OPLEDGER_REVIEW_WEBHOOK_SECRET{also}")]


def _sent_folder(settings: Settings) -> Check:
    """The SMTP adapter's Sent folder can be read. A warning, not a failure: unreadable,
    every lookup is inconclusive and an ambiguous SMTP send goes to a person, as without."""
    from opledger.adapters.imap import SentFolder

    folder = SentFolder.of(settings, timeout=CONNECT_TIMEOUT_S)
    assert folder is not None  # only called when the host is set
    try:
        count = folder.examine()
    except Exception as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return Check(
            "smtp sent folder",
            False,
            f"{folder.describe()}: {type(exc).__name__}: {text}; until it can be read, an "
            "ambiguous SMTP send goes to a person",
            warning=True,
        )
    return Check("smtp sent folder", True, f"{folder.describe()}: readable, {count} messages")


def _attempt(name: str, probe: Callable[[], str]) -> Check:
    try:
        return Check(name, True, probe())
    except Exception as exc:  # each driver raises its own; one line is what a person needs
        cause = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
        text = " ".join(str(cause).split()) or type(cause).__name__
        return Check(name, False, text.removeprefix("connection failed: "))


def _engine(url: str, schema: str) -> Any:
    from sqlalchemy.pool import NullPool

    from opledger.ledger.connector import ledger_engine

    return ledger_engine(
        url,
        schema=schema,
        poolclass=NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


def _postgres(engine: Any) -> Check:
    def probe() -> str:
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SHOW server_version").scalar_one()
        return f"reachable (PostgreSQL {version})"

    return _attempt("postgres", probe)


def _schema(engine: Any, url: str, schema: str) -> Check:
    from alembic.script import ScriptDirectory

    from opledger.ledger.migrate import alembic_config, ledger_schemas

    head = ScriptDirectory.from_config(alembic_config(url, schema)).get_current_head()

    def probe() -> str:
        with engine.connect() as conn:
            found = ledger_schemas(conn)
        current = found.get(schema)
        if current != head:
            state = "not migrated" if current is None else f"at {current}"
            elsewhere = sorted(name for name in found if name != schema)
            if current is None and elsewhere:
                raise RuntimeError(
                    f'schema "{schema}" holds no ledger, but schema "{elsewhere[0]}" does: '
                    f"move it with `opledger migrate --from-schema {elsewhere[0]}`, or set "
                    f"OPLEDGER_DATABASE_SCHEMA={elsewhere[0]}"
                )
            raise RuntimeError(
                f'the schema "{schema}" is {state}, not {head}: run `opledger migrate`'
            )
        return f'"{schema}" at the latest migration ({head})'

    return _attempt("schema", probe)


#: open operations by action, and how many of them a worker held because no adapter of
#: its served the action (an unknown one whose newest dispatch evidence says `no_adapter`:
#: read through the evidence index for the unknown ones only)
_OPEN_BY_ACTION = (
    "SELECT o.action, count(*),"
    " count(*) FILTER (WHERE CASE WHEN o.status = 'unknown' THEN ("
    "SELECT e.detail->>'why' FROM evidence AS e WHERE e.op_id = o.id"
    " AND e.source = 'dispatch' ORDER BY e.id DESC LIMIT 1) END = 'no_adapter')"
    " FROM operations AS o WHERE o.status IN ('prepared', 'dispatching', 'unknown')"
    " GROUP BY o.action"
)


def _actions_served(engine: Any, registry: Any) -> Check:
    """Open operations whose action no configured adapter serves, or that a worker held
    because none of its adapters does (a worker configured with other OPLEDGER_ADAPTERS
    than this process): a warning naming each action and how many operations, never a
    refusal to start. A worker holds such an operation (nothing sent, no review) and
    checks it again later, so a worker that serves the action (another configuration in
    a rolling deploy, or this one once fixed) sends it; refusing to start would let one
    operation (a mistyped action prepared through a ledger without the adapters) stop
    the whole fleet."""
    from sqlalchemy import text

    missing: list[tuple[str, int]] = []
    held: list[tuple[str, int]] = []

    def probe() -> str:
        with engine.connect() as conn:
            counts = conn.execute(text(_OPEN_BY_ACTION)).all()
        for action, n, unserved in sorted(counts):
            if action not in registry.actions:
                missing.append((action, n))
            elif unserved:
                held.append((action, unserved))
        return "every open operation's action has an adapter"

    check = _attempt("actions", probe)
    if not check.ok or not (missing or held):
        return check
    said = []
    if missing:
        said.append(f"open operations name actions no adapter serves: {_counted(missing)}")
    if held:
        said.append(
            f"workers without its adapter hold operations of {_counted(held)}: no worker "
            "that took them serves the action (their OPLEDGER_ADAPTERS differs from this "
            "process's)"
        )
    return Check(
        "actions",
        False,
        "; ".join(said) + "; they are held, not sent, until a worker whose OPLEDGER_ADAPTERS "
        "serves them runs; held longer than OPLEDGER_REVIEW_AFTER_SECONDS, a person is asked",
        warning=True,
    )


def _counted(actions: list[tuple[str, int]]) -> str:
    return ", ".join(f"{a} ({n} operation{'' if n == 1 else 's'})" for a, n in actions)


def _replication(engine: Any, settings: Settings) -> Check:
    """What a failover of the ledger's database could lose: a warning unless its commits
    wait for an attached synchronous standby (the workers refuse to claim then, in strict
    mode)."""
    from opledger.ledger import Ledger

    try:
        replication = Ledger(engine, schema=settings.database_schema).replication()
    except Exception as exc:  # one line is what a person needs
        return Check("replication", False, f"not read: {exc}", warning=True)
    if replication.durable_on_failover:
        return Check("replication", True, replication.summary())
    strict = settings.require_sync_standby
    detail = replication.summary() + (
        "; OPLEDGER_REQUIRE_SYNC_STANDBY is set: workers claim nothing until a synchronous "
        "standby is attached"
        if strict
        else "; see docs/production.md, High availability"
    )
    return Check("replication", False, detail, warning=True)


def _switches(engine: Any, schema: str) -> Iterator[Check]:
    """The ledger's last switch (a failover, a restore) and the providers' answers it kept
    for claims it no longer knew (orphan receipts)."""
    from opledger.ledger import Ledger

    try:
        ledger = Ledger(engine, schema=schema)
        newest = ledger.epochs(limit=1)
        unmatched = [o for o in ledger.orphan_receipts(unmatched=True, limit=1000) if o.forgotten]
    except Exception as exc:  # one line is what a person needs
        yield Check("ledger epoch", False, f"not read: {exc}", warning=True)
        return
    epoch = newest[0] if newest else None
    if epoch is None or not epoch.is_switch:
        yield Check("ledger epoch", True, "no switch recorded (epoch 0)")
    else:
        yield Check(
            "ledger epoch",
            True,
            f"epoch {epoch.epoch} since {epoch.began_at.isoformat(timespec='seconds')}: "
            f"{epoch.kind} switch, {epoch.reason}; {epoch.quarantined} operation(s) "
            "quarantined (`opledger switches` tells more)",
            warning=False,
        )
    if unmatched:
        yield Check(
            "orphan receipts",
            False,
            f"{len(unmatched)} provider answer(s) to claims the ledger forgot are not tied to "
            "an operation yet (`opledger switches orphans`)",
            warning=True,
        )


def _beat_lock(engine: Any, schema: str) -> Check:
    from opledger.ledger.pgschema import beat_lock_key, lock_words
    from opledger.ledger.queries.gauges import BEAT_LOCK_HOLDER

    def probe() -> str:
        with engine.connect() as conn:
            pid = conn.execute(BEAT_LOCK_HOLDER, lock_words(beat_lock_key(schema))).scalar()
        return "free (no beat running)" if pid is None else f"held by a beat (backend pid {pid})"

    return _attempt("beat lock", probe)


def _beat_seen(engine: Any, settings: Settings) -> Check:
    """Whether a beat ticked within `OPLEDGER_BEAT_MISSING_AFTER_SECONDS` (its heartbeat,
    written by its scheduler's loop): without one nothing relays, sweeps or reconciles."""
    from opledger.ledger import Ledger
    from opledger.ledger.beats import START_BEAT

    try:
        seen = Ledger(engine, schema=settings.database_schema).beat_seen()
    except Exception as exc:  # one line is what a person needs
        return Check("beat", False, f"its heartbeat cannot be read: {exc}")
    after = settings.beat_missing_after_seconds
    if not seen.missing(timedelta(seconds=after)):
        age = seen.age.total_seconds() if seen.age is not None else 0.0
        return Check("beat", True, f"ticked {age:.0f} s ago ({seen.who()})")
    if not seen.ever:
        said = "no beat has ever run against this ledger"
    else:
        said = (
            f"no beat seen for {after:g} s (OPLEDGER_BEAT_MISSING_AFTER_SECONDS): beat "
            f"{seen.since()}, last {seen.who()}"
        )
    return Check(
        "beat",
        False,
        f"{said}; without beat nothing relays, sweeps or reconciles (prepared operations whose "
        f"message was lost are never sent, unknown ones never checked): {START_BEAT}",
    )


def _broker(url: str, queues: Sequence[Any] = (), queue_type: str = "classic") -> Check:
    from kombu.connection import Connection

    def probe() -> str:
        with Connection(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.ensure_connection(max_retries=1, timeout=CONNECT_TIMEOUT_S)
            reachable = f"reachable ({_where(conn)})"
            if not queues or conn.transport.driver_type != "amqp":
                return reachable
            channel = conn.channel()
            try:
                for queue in queues:
                    try:
                        queue(channel).declare()
                    except conn.channel_errors as exc:
                        reason = getattr(exc, "reply_text", "") or str(exc)
                        raise RuntimeError(
                            f"queue {queue.name!r} and its exchange cannot be declared as "
                            f"OPLEDGER_RABBITMQ_QUEUE_TYPE={queue_type} says ({reason}); a "
                            "queue's or exchange's type cannot change: drain opledger's "
                            "queues and delete them and their exchanges, or use a new "
                            "virtual host"
                        ) from exc
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
            return f"{reachable}, {len(queues)} {queue_type} queues declared"

    return _attempt("broker", probe)


def _where(conn: Any) -> str:
    """The broker as the check reached it, without credentials: its Redis database number,
    or its RabbitMQ virtual host (each is part of where the messages go)."""
    vhost = conn.virtual_host or "/"
    where = f"{conn.transport_cls}://{conn.hostname}:{conn.port}"
    if conn.transport_cls.startswith("redis"):
        return f"{where}/{vhost.strip('/') or 0}"
    return f"{where}, virtual host {vhost!r}"


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok and not c.warning]
