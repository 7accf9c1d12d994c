"""Operators of the review console and their sessions, in the ledger's database.

An operator has a name (the one the audit trail shows), an argon2id password hash (or none:
an account that signs in only through a trusted SSO proxy header), and the tenants it acts
for, or every tenant (`all_tenants`). Disabling an account ends its sessions at once (every
request re-reads the account) and keeps the row, since the audit trail names it.

Sessions live on the server: the browser's cookie holds a random token, the table holds
only its sha256, the session's CSRF token, an absolute expiry and when it was last used
(an idle session expires too), and a notice its next page shows once (`flash`).

Every password check is recorded (`signin_attempts`: the name as typed, the address, the
result): `throttle.retry_at` decides from the recent failures whether the next one runs.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from pydantic import AwareDatetime, BaseModel, ConfigDict
from sqlalchemy import Engine

from opledger.ledger.approvals import check_approves
from opledger.ledger.connector import Connector
from opledger.ledger.errors import InvalidInput, LedgerError
from opledger.ledger.ids import check_key, check_operator
from opledger.ledger.queries import accounts as q
from opledger.ledger.queries import approvals as qa

from .throttle import Failures

#: the shortest password `operator add` accepts
MIN_PASSWORD_LENGTH = 12


class AccountError(LedgerError):
    """An operator account request was refused; nothing changed."""


class OperatorExists(AccountError):
    """An operator with this name exists already."""


class OperatorNotFound(AccountError, LookupError):
    """No operator with this name."""


class SignInAttempt(BaseModel):
    """One password check the console ran."""

    model_config = ConfigDict(frozen=True)

    at: AwareDatetime
    operator: str
    address: str
    ok: bool


class Operator(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    all_tenants: bool
    tenants: tuple[str, ...]
    has_password: bool
    created_by: str
    created_at: AwareDatetime
    disabled_at: AwareDatetime | None = None
    disabled_by: str | None = None
    #: the actions (patterns: `stripe.*`) whose acts this operator may approve before they
    #: are sent (`opledger.ledger.approvals`); none by default
    approves: tuple[str, ...] = ()

    def can_act_for(self, tenant: str) -> bool:
        return self.disabled_at is None and (self.all_tenants or tenant in self.tenants)

    @property
    def scope(self) -> str:
        return "every tenant" if self.all_tenants else ", ".join(self.tenants)


class Session(BaseModel):
    """An authenticated session: who, its CSRF token, until when."""

    model_config = ConfigDict(frozen=True)

    id: str  #: the sha256 of its cookie's token
    operator: Operator
    csrf_token: str
    expires_at: AwareDatetime


#: how long the sign-in record keeps an attempt
ATTEMPT_RETENTION = timedelta(days=90)


def _operator(row: Any, approves: Any = None) -> Operator:
    m = row._mapping
    return Operator(
        approves=tuple(approves if approves is not None else (m.get("approves") or ())),
        name=m["name"],
        all_tenants=m["all_tenants"],
        tenants=tuple(m["tenants"]),
        has_password=m["has_password"],
        created_by=m["created_by"],
        created_at=m["created_at"],
        disabled_at=m["disabled_at"],
        disabled_by=m["disabled_by"],
    )


def session_id(token: str) -> str:
    """What the table stores of a cookie's token."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_password(password: str) -> str:
    if not isinstance(password, str) or len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidInput(
            f"a password needs at least {MIN_PASSWORD_LENGTH} characters", field="password"
        )
    if len(password) > 1024:
        raise InvalidInput("a password has at most 1024 characters", field="password")
    return password


class Accounts:
    """Operator accounts and console sessions, on the ledger's engine."""

    def __init__(self, engine: Engine, hasher: PasswordHasher | None = None) -> None:
        self.engine = engine
        self._db = Connector(engine)  # database errors become ledger errors (SchemaMissing, ...)
        self.hasher = hasher or PasswordHasher()
        # verified against when a name is unknown, so a login takes as long either way
        self._dummy = self.hasher.hash(secrets.token_urlsafe(16))

    def add(
        self,
        name: str,
        *,
        tenants: list[str] | tuple[str, ...] = (),
        all_tenants: bool = False,
        password: str | None,
        by: str,
        approves: list[str] | tuple[str, ...] = (),
    ) -> Operator:
        """A new operator. `password=None`: signs in only through the trusted SSO header.
        `approves`: the action patterns whose acts they may approve (none by default)."""
        name = check_operator("operator", name)
        by = check_operator("by", by)
        scope = sorted({check_key("tenant", t) for t in tenants})
        if all_tenants and scope:
            raise InvalidInput("an operator acts for every tenant or for the ones listed: not both")
        if not all_tenants and not scope:
            raise InvalidInput("name at least one tenant (--tenant), or --all-tenants")
        patterns = check_approves(approves)
        hashed = None if password is None else self.hasher.hash(check_password(password))
        with self._db.transaction() as conn:
            row = conn.execute(
                q.INSERT_OPERATOR,
                {
                    "name": name,
                    "password_hash": hashed,
                    "all_tenants": all_tenants,
                    "tenants": scope,
                    "by": by,
                },
            ).one_or_none()
            if row is not None and patterns:
                conn.execute(qa.SET_OPERATOR_APPROVES, {"name": name, "approves": list(patterns)})
        if row is None:
            raise OperatorExists(f"an operator named {name!r} exists already", operator=name)
        return _operator(row, patterns)

    def set_approves(
        self, name: str, approves: list[str] | tuple[str, ...], *, by: str
    ) -> Operator:
        """Set what `name` may approve (action patterns; empty: nothing), replacing what
        they could approve before."""
        name = check_operator("operator", name)
        check_operator("by", by)
        patterns = check_approves(approves)
        with self._db.transaction() as conn:
            found = conn.execute(
                qa.SET_OPERATOR_APPROVES, {"name": name, "approves": list(patterns)}
            ).one_or_none()
            row = conn.execute(q.SELECT_LOGIN, {"name": name}).one_or_none()
        if found is None or row is None:
            raise OperatorNotFound(f"no operator named {name!r}", operator=name)
        return _operator(row, patterns)

    def disable(self, name: str, *, by: str) -> Operator:
        """Disable `name` and end its sessions; disabling twice keeps the first time."""
        name = check_operator("operator", name)
        by = check_operator("by", by)
        with self._db.transaction() as conn:
            row = conn.execute(q.DISABLE_OPERATOR, {"name": name, "by": by}).one_or_none()
        if row is None:
            raise OperatorNotFound(f"no operator named {name!r}", operator=name)
        return _operator(row)

    def list(self) -> tuple[Operator, ...]:
        with self._db.statement() as conn:
            approves = {r.name: r.approves for r in conn.execute(qa.SELECT_OPERATOR_APPROVES)}
            return tuple(
                _operator(r, approves.get(r.name)) for r in conn.execute(q.SELECT_OPERATORS)
            )

    def approves_of(self, name: str) -> tuple[str, ...]:
        """What `name` may approve (its action patterns; empty: nothing, or no such
        operator). A session's operator is read without them: the approval pages ask."""
        with self._db.statement() as conn:
            row = conn.execute(qa.SELECT_APPROVES_OF, {"name": name}).one_or_none()
        return () if row is None else tuple(row.approves or ())

    def enabled_count(self) -> int:
        with self._db.statement() as conn:
            return int(conn.execute(q.COUNT_ENABLED).scalar_one())

    def operator(self, name: str) -> Operator | None:
        """The enabled operator `name`, or None (unknown, disabled or not a valid name)."""
        try:
            name = check_operator("operator", name)
        except InvalidInput:
            return None
        with self._db.statement() as conn:
            row = conn.execute(q.SELECT_LOGIN, {"name": name}).one_or_none()
        if row is None or row.disabled_at is not None:
            return None
        return _operator(row)

    def authenticate(self, name: str, password: str) -> Operator | None:
        """The operator if `password` is theirs and the account is enabled, else None."""
        try:
            name = check_operator("operator", name)
        except InvalidInput:
            name = ""
        row = None
        if name:
            with self._db.statement() as conn:
                row = conn.execute(q.SELECT_LOGIN, {"name": name}).one_or_none()
        stored = row.password_hash if row is not None and row.password_hash else self._dummy
        try:
            self.hasher.verify(stored, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        if row is None or not row.password_hash or row.disabled_at is not None:
            return None
        if self.hasher.check_needs_rehash(stored):
            with self._db.transaction() as conn:
                conn.execute(q.UPDATE_HASH, {"name": name, "hash": self.hasher.hash(password)})
        return _operator(row)

    def start_session(self, operator: Operator, *, lifetime: timedelta) -> tuple[str, Session]:
        """A new session for `operator`: the cookie's token and the session."""
        token = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        with self._db.transaction() as conn:
            conn.execute(q.PURGE_SESSIONS)
            expires: datetime = conn.execute(
                q.INSERT_SESSION,
                {
                    "id": session_id(token),
                    "operator": operator.name,
                    "csrf": csrf,
                    "lifetime": lifetime,
                },
            ).scalar_one()
        return token, Session(
            id=session_id(token), operator=operator, csrf_token=csrf, expires_at=expires
        )

    def session(self, token: str, *, idle: timedelta) -> Session | None:
        """The live session of this cookie token (and mark it used), or None."""
        if not token or len(token) > 200:
            return None
        with self._db.transaction() as conn:
            row = conn.execute(
                q.TOUCH_SESSION, {"id": session_id(token), "idle": idle}
            ).one_or_none()
        if row is None:
            return None
        return Session(
            id=row.id,
            operator=_operator(row),
            csrf_token=row.csrf_token,
            expires_at=row.expires_at,
        )

    def end_session(self, token: str) -> None:
        with self._db.transaction() as conn:
            conn.execute(q.END_SESSION, {"id": session_id(token)})

    def set_flash(self, session: Session, page: str, notice: dict[str, str]) -> None:
        """What `page` says once, the next time this session opens it."""
        with self._db.transaction() as conn:
            conn.execute(q.SET_FLASH, {"id": session.id, "flash": {"page": page, **notice}})

    def take_flash(self, session: Session, page: str) -> dict[str, str] | None:
        """The session's notice for `page`, cleared (None: there is none for it)."""
        with self._db.transaction() as conn:
            found = conn.execute(q.TAKE_FLASH, {"id": session.id, "page": page}).scalar()
        return dict(found) if found else None

    # -- the sign-in record ---------------------------------------------------------------

    def signin_failures(self, name: str, address: str, *, window: timedelta) -> Failures:
        """Recent failed sign-ins of this name (since its last success) and this address."""
        with self._db.statement() as conn:
            row = conn.execute(
                q.SELECT_FAILURES,
                {"operator": signin_name(name), "address": address, "window": window},
            ).one()
        return Failures(
            operator=row.operator_n,
            operator_last=row.operator_last,
            address=row.address_n,
            address_last=row.address_last,
            now=row.now,
        )

    def record_signin(self, name: str, address: str, *, ok: bool) -> None:
        """Record one password check (a success also drops attempts past retention)."""
        with self._db.transaction() as conn:
            conn.execute(
                q.INSERT_ATTEMPT, {"operator": signin_name(name), "address": address, "ok": ok}
            )
            if ok:
                conn.execute(q.PURGE_ATTEMPTS, {"keep": ATTEMPT_RETENTION})

    def signins(self, name: str, *, limit: int = 50) -> tuple[SignInAttempt, ...]:
        """The latest password checks of the name `name`, newest first."""
        with self._db.statement() as conn:
            rows = conn.execute(q.SELECT_ATTEMPTS, {"operator": signin_name(name), "limit": limit})
            return tuple(SignInAttempt.model_validate(dict(r._mapping)) for r in rows)


def signin_name(name: str) -> str:
    """The name a sign-in attempt is recorded under: as typed, bounded, with any NUL (which
    a form can carry and Postgres text cannot) as U+FFFD. No operator has such a name, so
    it is an unknown name, counted and throttled under a name of its own."""
    return name.strip()[:120].replace("\x00", "\ufffd")
