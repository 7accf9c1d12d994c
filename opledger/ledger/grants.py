"""Authorizations: grants, their scope, revocation, and the check every write makes."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from . import queries as q
from . import store
from .base import LedgerBase
from .errors import (
    AuthorizationError,
    AuthorizationRevoked,
    InvalidInput,
    OutOfScope,
    UnknownAuthorization,
)
from .ids import (
    check_identifier,
    check_key,
    check_operator,
    new_operation_id,
)
from .models import (
    Authorization,
)

SCOPE_PATTERN_MAX = 120


class Grants(LedgerBase):
    """Grants: which actions a tenant's operations may write, until revoked or expired."""

    def grant(
        self,
        *,
        tenant: str,
        scope: Sequence[str],
        granted_by: str,
        ref: str | None = None,
        expires_at: datetime | None = None,
    ) -> Authorization:
        """Record a grant letting `tenant` write the actions matching `scope`.

        Granting the same ref again with the same tenant and scope returns it unchanged.
        """
        tenant = check_key("tenant", tenant)
        granted_by = check_operator("granted_by", granted_by)
        ref = check_identifier("ref", ref) if ref is not None else f"auth_{new_operation_id()[3:]}"
        patterns = _check_scope(scope)
        if expires_at is not None and expires_at.tzinfo is None:
            raise InvalidInput("expires_at must be timezone-aware", field="expires_at")
        with self._tx() as conn:
            row = conn.execute(
                q.INSERT_AUTHORIZATION,
                {
                    "ref": ref,
                    "tenant": tenant,
                    "scope": list(patterns),
                    "granted_by": granted_by,
                    "expires_at": expires_at,
                },
            ).one_or_none()
            if row is None:
                row = conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one()
                if row.tenant != tenant or tuple(row.scope) != patterns:
                    raise AuthorizationError(
                        f"authorization {ref!r} already exists with another tenant or scope",
                        ref=ref,
                    )
        return store.authorization(row)

    def revoke(self, ref: str, *, by: str, reason: str) -> Authorization:
        """Revoke a grant. New writes under it stop; lookups and evidence continue.

        Prepared operations under it are cancelled when a worker next tries to claim them.
        Revoking twice keeps the first revocation.
        """
        check_identifier("ref", ref)
        by = check_operator("by", by)
        check_identifier("reason", reason, max_length=2000)
        with self._tx() as conn:
            row = conn.execute(q.REVOKE_AUTHORIZATION, {"ref": ref, "by": by, "reason": reason})
            found = (
                row.one_or_none()
                or conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one_or_none()
            )
        if found is None:
            raise UnknownAuthorization(f"no authorization {ref!r}", ref=ref)
        return store.authorization(found)

    def authorization(self, ref: str) -> Authorization:
        """The grant named `ref`."""
        check_identifier("ref", ref)
        with self._single() as conn:
            row = conn.execute(q.SELECT_AUTHORIZATION, {"ref": ref}).one_or_none()
        if row is None:
            raise UnknownAuthorization(f"no authorization {ref!r}", ref=ref)
        return store.authorization(row)

    def authorizations(
        self, *, tenant: str | None = None, limit: int = 100
    ) -> tuple[Authorization, ...]:
        """Grants, newest first (revoked and expired ones too); only `tenant`'s when given."""
        if tenant is not None:
            tenant = check_key("tenant", tenant)
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_AUTHORIZATIONS, {"tenant": tenant, "limit": max(1, min(limit, 10_000))}
            )
            return tuple(store.authorization(r) for r in rows)


def _check_scope(scope: Sequence[str]) -> tuple[str, ...]:
    if isinstance(scope, str) or not scope:
        raise InvalidInput("scope must be a non-empty list of action patterns", field="scope")
    patterns = []
    for pattern in scope:
        check_identifier("scope pattern", pattern, max_length=SCOPE_PATTERN_MAX)
        if not all(ch.isalnum() or ch in "._*" for ch in pattern):
            raise InvalidInput(f"scope pattern {pattern!r} has characters other than a-z0-9._*")
        patterns.append(pattern)
    return tuple(patterns)


def _check_grant(grant: Any, *, tenant: str, action: str, ref: str) -> None:
    if grant is None or grant.tenant != tenant:
        raise UnknownAuthorization(f"no authorization {ref!r} for tenant {tenant!r}", ref=ref)
    if not any(fnmatch.fnmatchcase(action, p) for p in grant.scope):
        raise OutOfScope(f"authorization {ref!r} does not cover {action!r}", ref=ref)
    if not grant.active:  # last: a revoked grant that covers the action may still read
        raise AuthorizationRevoked(f"authorization {ref!r} is no longer active", ref=ref)
