"""The review console's pages: the queue, one review and its resolution, the audit trail,
an operation, search. Every page acts for the signed-in operator and the tenant in its URL
(`/t/{tenant}/...`): a tenant the operator does not act for, and another tenant's
operation, are the same "not found". Every decision goes through `ledger.reviews`.

The queue also names the providers under pressure (`Ledger.providers`): paused by a "not
now" or an open breaker, with why and since when. How many operations wait for a
provider's room is counted across every tenant, so only an operator acting for every
tenant is shown it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from opledger.ledger import Resolution
from opledger.ledger.consequences import contract_facts
from opledger.ledger.errors import (
    InvalidInput,
    OperationNotFound,
    ReviewAlreadyResolved,
    ReviewError,
    ReviewNotFound,
    StaleView,
)
from opledger.ledger.facades import ReviewQueue
from opledger.ledger.ids import parse_age
from opledger.ledger.models import Operation, Status
from opledger.ledger.providers import ProviderState

from .base import ConsoleConfig, Refusal, not_found
from .sessions import Auth
from .web import Pages, ago


class Routes:
    """The pages' handlers (`Pages.page` / `Pages.form_page` make endpoints of them).
    `publish_retry(op_id)` hands an authorized retry to a worker now (None when published,
    else why not); without it, the sweep sends it. `providers()` reads the providers'
    pressure (`Ledger.providers`)."""

    def __init__(
        self,
        pages: Pages,
        reviews: ReviewQueue,
        config: ConsoleConfig,
        publish_retry: Callable[[str], str | None] | None,
        providers: Callable[[], list[ProviderState]],
    ) -> None:
        self.pages, self.reviews, self.config = pages, reviews, config
        self.publish_retry = publish_retry
        self.providers = providers

    def tenant_of(self, auth: Auth, tenant: str) -> str:
        if not auth.operator.can_act_for(tenant):
            raise not_found()  # exactly what a missing operation says
        return tenant

    def my_tenants(self, auth: Auth) -> list[str]:
        if auth.operator.all_tenants:
            return [t for t, _ in self.reviews.tenants_with_open_reviews()]
        return list(auth.operator.tenants)

    def pressure(self, auth: Auth) -> tuple[list[ProviderState], bool]:
        """The providers under pressure the queue names, and whether their waiting
        operations are counted for this operator (fleet-wide counts: every tenant's)."""
        everyone = auth.operator.all_tenants
        shown = [p for p in self.providers() if p.paused or (everyone and p.waiting)]
        return shown, everyone

    # -- the queue ----------------------------------------------------------------------

    def queue(self, request: Request, auth: Auth) -> Response:
        params = request.query_params
        mine = self.my_tenants(auth)
        chosen = params.get("tenant", "").strip()
        if chosen:
            self.tenant_of(auth, chosen)
        tenants = [chosen] if chosen else mine
        action = params.get("action", "").strip() or None
        reason = params.get("reason", "").strip() or None
        age_text = params.get("age", "").strip()
        age = parse_age(age_text) if age_text else None
        rows = []
        counts: dict[str, dict[str, int]] = {"tenant": {}, "action": {}, "reason": {}}
        for tenant in tenants:
            for r in self.reviews.list(
                tenant=tenant, older_than=age, action=action, reason=reason, limit=1000
            ):
                rows.append(r)
            for c in self.reviews.counts(tenant=tenant):
                counts["tenant"][tenant] = counts["tenant"].get(tenant, 0) + c.n
                counts["action"][c.action] = counts["action"].get(c.action, 0) + c.n
                counts["reason"][c.reason] = counts["reason"].get(c.reason, 0) + c.n
        rows.sort(key=lambda r: (r.opened_at, r.op_id))
        now = datetime.now(UTC)
        providers, show_waiting = self.pressure(auth)
        return self.pages.render(
            request,
            "queue.html",
            auth=auth,
            rows=rows,
            providers=providers,
            show_waiting=show_waiting,
            counts=counts,
            total=sum(counts["tenant"].values()),
            tenants=mine,
            filters={
                "tenant": chosen,
                "action": action or "",
                "reason": reason or "",
                "age": age_text,
            },
            ago=lambda t: ago(t, now),
        )

    # -- one review ---------------------------------------------------------------------

    def review(self, request: Request, auth: Auth) -> Response:
        tenant = self.tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        try:
            view = self.reviews.show(op_id, tenant=tenant, operator=auth.operator.name)
        except ReviewAlreadyResolved as exc:
            raise Refusal(409, "already resolved", str(exc), tenant=tenant, op_id=op_id) from exc
        payload = self.reviews.payload(op_id, tenant=tenant)
        shown_payload, hidden = (
            self.config.redaction.apply(view.operation.action, payload)
            if payload is not None
            else (None, [])
        )
        no_dedup = view.contract is not None and view.contract.idempotency.kind == "none"
        return self.pages.render(
            request,
            "review.html",
            auth=auth,
            tenant=tenant,
            view=view,
            op=view.operation,
            shown=self.config.redaction.results(
                view.operation.action, view.attempts, view.evidence
            ),
            payload=shown_payload,
            hidden=hidden,
            facts=contract_facts(view.contract) if view.contract else [],
            no_dedup=no_dedup,
            hint=view.review.snapshot.get("search_hint"),
        )

    def resolve(self, request: Request, auth: Auth, form: Any) -> Response:
        tenant = self.tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        back = {"tenant": tenant, "op_id": op_id}
        choice = str(form.get("resolution", ""))
        try:
            seen_version = int(str(form.get("seen_version", "")))
        except ValueError:
            raise Refusal(
                400, "refused", "the form does not say which view it was made from: reload it"
            ) from None
        evidence = text_field(form, "evidence")
        try:
            after = self.reviews.resolve(
                op_id,
                tenant=tenant,
                operator=auth.operator.name,  # the session's operator, never a form field
                resolution=choice,
                note=text_field(form, "note") or "",
                evidence=evidence,
                new_key=form.get("new_key") == "yes",
                acknowledge_risk=form.get("accept_risk") == "yes",
                override_evidence=form.get("override_evidence") == "yes",
                seen_version=seen_version,
            )
        except StaleView as exc:
            changes = list(exc.fields.get("changes") or ())
            raise Refusal(
                409,
                "this operation changed since you opened it",
                "this operation changed since you opened it: here is what changed"
                if changes
                else str(exc),
                changes=changes,
                detail=str(exc),
                **back,
            ) from exc
        except ReviewAlreadyResolved as exc:
            raise Refusal(409, "already resolved", str(exc), **back) from exc
        except (ReviewNotFound, OperationNotFound):
            raise not_found() from None
        except (ReviewError, InvalidInput) as exc:
            raise Refusal(409, "refused", str(exc), **back) from exc
        done: dict[str, str] = {"done": Resolution(choice).value, "status": after.status.value}
        if Resolution(choice) is Resolution.RETRY:
            why = (
                self.publish_retry(op_id)
                if self.publish_retry is not None
                else "no broker configured"
            )
            done["published"] = "yes" if why is None else "no"
        url = f"/t/{quote(tenant, safe='')}/ops/{op_id}/audit"
        # the banner is what this session did, kept on the server: never a URL's say-so
        self.pages.sessions.accounts.set_flash(auth.session, f"audit {tenant} {op_id}", done)
        return RedirectResponse(url, status_code=303)

    # -- the audit trail, operations, search --------------------------------------------

    def audit(self, request: Request, auth: Auth) -> Response:
        tenant = self.tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        history = self.reviews.history(op_id, tenant=tenant)
        actions = self.reviews.audit(op_id, tenant=tenant)
        done = (
            self.pages.sessions.accounts.take_flash(auth.session, f"audit {tenant} {op_id}") or {}
        )
        return self.pages.render(
            request,
            "audit.html",
            auth=auth,
            tenant=tenant,
            op=history.operation,
            history=history,
            actions=actions,
            done=done.get("done"),
            published=done.get("published"),
        )

    def operation(self, request: Request, auth: Auth) -> Response:
        tenant = self.tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        history = self.reviews.history(op_id, tenant=tenant)
        payload = self.reviews.payload(op_id, tenant=tenant)
        shown, hidden = (
            self.config.redaction.apply(history.operation.action, payload)
            if payload is not None
            else (None, [])
        )
        open_review = history.open_review is not None
        return self.pages.render(
            request,
            "operation.html",
            auth=auth,
            tenant=tenant,
            op=history.operation,
            history=history,
            shown=self.config.redaction.results(
                history.operation.action, history.attempts, history.evidence
            ),
            payload=shown,
            hidden=hidden,
            # an unknown operation's review, or a settled one's (a possible duplicate)
            open_review=open_review
            and (history.operation.status is Status.UNKNOWN or history.operation.status.final),
        )

    def search(self, request: Request, auth: Auth) -> Response:
        params = request.query_params
        by = params.get("by", "id")
        value = params.get("q", "").strip()
        chosen = params.get("tenant", "").strip()
        mine = self.my_tenants(auth)
        if chosen:
            self.tenant_of(auth, chosen)
        results: list[Operation] = []
        if value:
            if by not in ("id", "workflow", "target"):
                raise InvalidInput("search by id, workflow or target", field="by")
            for tenant in [chosen] if chosen else mine:
                results.extend(
                    self.reviews.search(
                        tenant=tenant,
                        op_id=value if by == "id" else None,
                        workflow_id=value if by == "workflow" else None,
                        target=value if by == "target" else None,
                    )
                )
        return self.pages.render(
            request,
            "search.html",
            auth=auth,
            results=results,
            by=by,
            q=value,
            tenant=chosen,
            tenants=mine,
        )


def text_field(form: Any, name: str) -> str | None:
    """A free-text field as written: line breaks as LF (a browser sends CRLF), trimmed;
    None when blank. Other control characters are left for the ledger to refuse."""
    value = str(form.get(name, "")).replace("\r\n", "\n").replace("\r", "\n").strip()
    return value or None
