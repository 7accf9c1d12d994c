"""The console's approval queue: the acts waiting for a person before anything is sent
(`opledger.ledger.approvals`), beside the review queue.

The queue lists the pending approvals of the tenants the signed-in operator acts for whose
actions its approval scope (`approves`) covers; the nav counts those still waiting for
them. One approval's page shows the act as `opledger approvals show` does: its action,
target and grant, why the policy asks, the frozen payload with the same redaction as the
review page, the digest it was shown with, and every decision so far; its Approve and Deny
forms post that digest back. Every decision is the ledger's own statement
(`Ledger.approve`/`deny`), with the operator taken from the session, never from the form:
a digest that is no longer the payload's (a page shown before it changed), an operator
who may not approve it or asked for it, an approval decided meanwhile are refused there,
and shown as the review pages show their refusals. Another tenant's approval is "not
found", as another tenant's operation is.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from opledger.ledger.approvals import Approval
from opledger.ledger.errors import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyGiven,
    ApprovalError,
    ApprovalNotFound,
    AuthorizationRevoked,
    NotAnApprover,
    StaleApproval,
)
from opledger.ledger.facades import ApprovalDesk, ReviewQueue

from .base import ConsoleConfig, Refusal, not_found
from .routes import text_field
from .sessions import Auth
from .web import Pages

CHANGED = "this act changed since you opened it"


def covers(patterns: Iterable[str], action: str) -> bool:
    """Whether one of an operator's approval patterns (`stripe.*`: `*` any run of
    characters, as the ledger reads them) covers `action`."""
    return any(fnmatch.fnmatchcase(action, p) for p in patterns)


def approval_url(tenant: str, op_id: str) -> str:
    return f"/t/{quote(tenant, safe='')}/ops/{op_id}/approval"


class ApprovalPages:
    """The approval queue, one approval, and its two forms (`Pages.page`/`form_page` make
    endpoints of them)."""

    def __init__(
        self, pages: Pages, desk: ApprovalDesk, reviews: ReviewQueue, config: ConsoleConfig
    ) -> None:
        self.pages, self.desk, self.reviews, self.config = pages, desk, reviews, config

    # -- whose ----------------------------------------------------------------------------

    def approves(self, auth: Auth) -> tuple[str, ...]:
        """The signed-in operator's approval scope, as it stands now."""
        return auth.operator.approves or self.pages.sessions.accounts.approves_of(
            auth.operator.name
        )

    def mine(self, auth: Auth) -> list[Approval]:
        """The pending approvals this operator may decide (its tenants, its actions), oldest
        first."""
        patterns = self.approves(auth)
        if not patterns:
            return []
        operator = auth.operator
        tenants: list[str | None] = [None] if operator.all_tenants else list(operator.tenants)
        rows = [
            a
            for tenant in tenants
            for a in self.desk.approvals(tenant=tenant, status="pending", limit=1000)
            if covers(patterns, a.action)
        ]
        return sorted(rows, key=lambda a: (a.requested_at, a.op_id))

    def waiting_for(self, auth: Auth) -> int:
        """How many of them wait for this operator: not approved by them already, not asked
        for by them (the nav's count)."""
        name = auth.operator.name
        return sum(
            1
            for a in self.mine(auth)
            if name not in a.approved_by and name not in (a.requested_by, a.asked_by)
        )

    def _approval(self, auth: Auth, tenant: str, op_id: str) -> Approval:
        """`op_id`'s approval, when it is of `tenant` and the operator acts for it: else
        "not found", as another tenant's operation is."""
        if not auth.operator.can_act_for(tenant):
            raise not_found()
        try:
            approval = self.desk.approval(op_id)
        except ApprovalNotFound:
            raise not_found() from None
        if approval.tenant != tenant:
            raise not_found()
        return approval

    # -- the pages ------------------------------------------------------------------------

    def queue(self, request: Request, auth: Auth) -> Response:
        rows = self.mine(auth)
        return self.pages.render(
            request,
            "approvals.html",
            auth=auth,
            rows=rows,
            approves=self.approves(auth),
        )

    def approval(self, request: Request, auth: Auth) -> Response:
        tenant, op_id = request.path_params["tenant"], request.path_params["op_id"]
        approval = self._approval(auth, tenant, op_id)
        patterns = self.approves(auth)
        if not covers(patterns, approval.action):
            raise Refusal(
                403,
                "refused",
                f"{auth.operator.name} may not approve {approval.action}: your approval scope "
                f"({', '.join(patterns) or 'none'}) does not cover it. An admin gives one "
                "with `opledger operator update NAME --approves PATTERN`.",
            )
        history = self.reviews.history(op_id, tenant=tenant)
        payload = self.reviews.payload(op_id, tenant=tenant)
        shown, hidden = (
            self.config.redaction.apply(approval.action, payload)
            if payload is not None
            else (None, [])
        )
        done = (
            self.pages.sessions.accounts.take_flash(auth.session, f"approval {tenant} {op_id}")
            or {}
        )
        return self.pages.render(
            request,
            "approval.html",
            auth=auth,
            tenant=tenant,
            approval=approval,
            op=history.operation,
            payload=shown,
            hidden=hidden,
            decisions=self.desk.approval_decisions(op_id),
            done=done,
        )

    def approve(self, request: Request, auth: Auth, form: Any) -> Response:
        return self._decide(request, auth, form, approving=True)

    def deny(self, request: Request, auth: Auth, form: Any) -> Response:
        return self._decide(request, auth, form, approving=False)

    def _decide(self, request: Request, auth: Auth, form: Any, *, approving: bool) -> Response:
        tenant, op_id = request.path_params["tenant"], request.path_params["op_id"]
        approval = self._approval(auth, tenant, op_id)
        again = approval_url(tenant, op_id)
        digest = str(form.get("digest", "")).strip()
        if not digest:
            raise Refusal(
                400,
                "refused",
                "the form does not say which payload it showed you (its digest): reload it",
                again=again,
            )
        # what the decision records as shown: the payload as this console shows it
        payload = self.reviews.payload(op_id, tenant=tenant)
        shown = (
            self.config.redaction.apply(approval.action, payload)[0]
            if payload is not None
            else None
        )
        note = text_field(form, "note")
        operator = auth.operator.name  # the session's operator, never a form field
        try:
            if approving:
                after = self.desk.approve(
                    op_id, operator=operator, digest=digest, note=note, shown=shown
                )
            else:
                after = self.desk.deny(
                    op_id, operator=operator, digest=digest, note=note or "", shown=shown
                )
        except StaleApproval as exc:
            raise Refusal(409, CHANGED, str(exc), again=again) from exc
        except ApprovalAlreadyGiven as exc:
            raise Refusal(409, "already approved by you", str(exc), again=again) from exc
        except ApprovalAlreadyDecided as exc:
            # without a status: it moved while the ledger looked (its binding changed)
            title = "already decided" if "status" in exc.fields else CHANGED
            raise Refusal(409, title, str(exc), again=again) from exc
        except NotAnApprover as exc:
            raise Refusal(403, "refused", str(exc)) from exc
        except ApprovalNotFound:
            raise not_found() from None
        except (AuthorizationRevoked, ApprovalError) as exc:
            raise Refusal(409, "refused", str(exc), again=again) from exc
        notice = {
            "done": "approved" if approving else "denied",
            "status": after.status,
            "released": "yes" if after.released else "no",
            "missing": str(after.approvals_missing),
        }
        # the banner is what this session did, kept on the server: never a URL's say-so
        self.pages.sessions.accounts.set_flash(auth.session, f"approval {tenant} {op_id}", notice)
        return RedirectResponse(again, status_code=303)
