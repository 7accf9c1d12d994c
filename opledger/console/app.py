"""The review console as an ASGI app (Starlette, server-rendered Jinja2, no JavaScript).

Every page acts for one authenticated operator and one tenant named in its URL
(`/t/{tenant}/...`); a tenant the operator does not act for, and another tenant's operation,
are the same "not found". Every decision goes through `ledger.reviews` — the same code,
checks and audit trail as `opledger review` — with the operator taken from the session,
never from the form. Every form carries the session's CSRF token.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from ipaddress import ip_address, ip_network
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from opledger.ledger import Ledger, Resolution
from opledger.ledger.consequences import contract_facts
from opledger.ledger.errors import (
    InvalidInput,
    OperationNotFound,
    ReviewAlreadyResolved,
    ReviewError,
    ReviewNotFound,
    StaleView,
)
from opledger.ledger.models import Operation, Status

from .accounts import Accounts, Operator, Session
from .redaction import Redaction

log = logging.getLogger("opledger.console")

SESSION_COOKIE = "opledger_session"
LOGIN_COOKIE = "opledger_login"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class ConsoleConfig:
    #: an idle session ends after this long without a request
    idle_timeout: timedelta = timedelta(minutes=30)
    #: and any session after this long
    session_lifetime: timedelta = timedelta(hours=8)
    #: trusted-header mode: the header an SSO proxy sets to the signed-in operator's name
    trusted_header: str | None = None
    #: the addresses such a proxy connects from (nobody else may set the header)
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    #: cookies only over HTTPS (set it behind a TLS-terminating proxy)
    secure_cookies: bool = False
    redaction: Redaction = field(default_factory=Redaction)


class Refusal(Exception):
    """An HTTP refusal rendered as a page: status, title, message."""

    def __init__(self, status: int, title: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.title, self.message, self.extra = status, title, message, extra


def not_found() -> Refusal:
    return Refusal(404, "not found", "not found")


@dataclass
class Auth:
    session: Session
    new_token: str | None = None  #: a session started on this request (trusted header)

    @property
    def operator(self) -> Operator:
        return self.session.operator


def parse_age(text: str) -> timedelta:
    """'90s', '15m', '2h', '3d' -> timedelta (a typed error otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    try:
        amount = float(text[:-1])
        if amount < 0 or amount != amount:
            raise ValueError(text)
        return timedelta(seconds=amount * units[text[-1]])
    except (KeyError, ValueError, IndexError, OverflowError):
        raise InvalidInput(
            f"age {text!r}: use a number and s, m, h or d (e.g. 2h)", field="age"
        ) from None


def _ago(value: datetime, now: datetime) -> str:
    seconds = max(0, int((now - value).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def _when(value: Any) -> str:
    return "" if value is None else str(value)[:19].replace("T", " ")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _binds(binding: Any) -> list[str]:
    names = {
        "idempotency_key": "key",
        "receipt_id": "receipt",
        "target": "target",
        "payload_digest": "payload digest",
        "resulting_version": "resulting version",
    }
    return [f"{label} {getattr(binding, k)}" for k, label in names.items() if getattr(binding, k)]


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("opledger.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["pretty"] = _json
    env.filters["binds"] = _binds
    env.globals["quote"] = lambda s: quote(str(s), safe="")
    return env


def create_app(
    ledger: Ledger,
    accounts: Accounts,
    config: ConsoleConfig | None = None,
    *,
    publish_retry: Callable[[str], str | None] | None = None,
) -> Starlette:
    """The console for `ledger`. `publish_retry(op_id)` hands an authorized retry to a
    worker now (None when published, else why not); without it, the sweep sends it."""
    cfg = config or ConsoleConfig()
    env = _environment()
    reviews = ledger.reviews
    proxies = [ip_network(p, strict=False) for p in cfg.trusted_proxies]

    def render(
        request: Request, name: str, status: int = 200, auth: Auth | None = None, **ctx: Any
    ) -> HTMLResponse:
        ctx.setdefault("operator", auth.operator if auth else None)
        ctx.setdefault("csrf", auth.session.csrf_token if auth else "")
        ctx.setdefault("trusted_header", cfg.trusted_header)
        html = env.get_template(name).render(request=request, **ctx)
        response = HTMLResponse(html, status_code=status)
        if auth is not None and auth.new_token:
            _set_session_cookie(request, response, auth.new_token)
        return response

    def _secure(request: Request) -> bool:
        return cfg.secure_cookies or request.url.scheme == "https"

    def _set_session_cookie(request: Request, response: Response, token: str) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            token,
            max_age=int(cfg.session_lifetime.total_seconds()),
            httponly=True,
            samesite="strict",
            secure=_secure(request),
            path="/",
        )

    def _from_proxy(request: Request) -> bool:
        host = request.client.host if request.client else ""
        try:
            address = ip_address(host)
        except ValueError:
            return host in cfg.trusted_proxies  # a name such as a test client's
        return any(address in net for net in proxies)

    def authenticate(request: Request) -> Auth | None:
        """The session of this request, or None (not signed in). Blocking: threadpool."""
        token = request.cookies.get(SESSION_COOKIE, "")
        session = accounts.session(token, idle=cfg.idle_timeout) if token else None
        if cfg.trusted_header is None:
            return Auth(session) if session else None
        if not _from_proxy(request):
            raise Refusal(
                403,
                "refused",
                f"this console trusts the {cfg.trusted_header} header only from its SSO "
                "proxy: connect through the proxy",
            )
        name = request.headers.get(cfg.trusted_header, "").strip()
        if not name:
            raise Refusal(
                401, "not signed in", f"the SSO proxy sent no {cfg.trusted_header} header"
            )
        if session is not None and session.operator.name == name:
            return Auth(session)
        operator = accounts.operator(name)
        if operator is None:
            raise Refusal(
                403,
                "refused",
                f"{name!r} is no enabled operator of this console: ask an admin to run "
                f"`opledger operator add {name} --tenant TENANT --sso-only`",
            )
        token, session = accounts.start_session(operator, lifetime=cfg.session_lifetime)
        return Auth(session, new_token=token)

    def check_csrf(auth: Auth, form: Any) -> None:
        sent = form.get("csrf_token")
        if not isinstance(sent, str) or not hmac.compare_digest(
            sent.encode(), auth.session.csrf_token.encode()
        ):
            raise Refusal(
                403,
                "refused",
                "this form has no valid CSRF token: nothing was changed. Reload the page "
                "and submit it from there.",
            )

    def tenant_of(auth: Auth, tenant: str) -> str:
        if not auth.operator.can_act_for(tenant):
            raise not_found()  # exactly what a missing operation says
        return tenant

    def my_tenants(auth: Auth) -> list[str]:
        if auth.operator.all_tenants:
            return [t for t, _ in reviews.tenants_with_open_reviews()]
        return list(auth.operator.tenants)

    Handler = Callable[[Request, Auth], Response]

    def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """An authenticated GET page: runs in the threadpool; refusals become pages."""

        async def endpoint(request: Request) -> Response:
            def run() -> Response:
                auth = authenticate(request)
                if auth is None:
                    return RedirectResponse(
                        "/login?" + urlencode({"next": request.url.path}), status_code=303
                    )
                return handler(request, auth)

            return await _guarded(request, run)

        return endpoint

    def form_page(
        handler: Callable[[Request, Auth, Any], Response],
    ) -> Callable[[Request], Awaitable[Response]]:
        """An authenticated POST: the CSRF token is checked before anything else runs."""

        async def endpoint(request: Request) -> Response:
            form = await request.form()

            def run() -> Response:
                auth = authenticate(request)
                if auth is None:
                    raise Refusal(401, "not signed in", "your session ended: sign in again")
                check_csrf(auth, form)
                return handler(request, auth, form)

            return await _guarded(request, run)

        return endpoint

    async def _guarded(request: Request, run: Callable[[], Response]) -> Response:
        try:
            response = await run_in_threadpool(run)
        except Refusal as refusal:
            response = render(
                request,
                "refused.html",
                refusal.status,
                title=refusal.title,
                message=refusal.message,
                **refusal.extra,
            )
        except (OperationNotFound, ReviewNotFound):
            response = render(request, "refused.html", 404, title="not found", message="not found")
        except InvalidInput as exc:
            response = render(request, "refused.html", 400, title="refused", message=str(exc))
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    # -- sign in and out -----------------------------------------------------------------

    async def login(request: Request) -> Response:
        next_url = request.query_params.get("next", "/")
        if request.method == "GET":
            if cfg.trusted_header:
                return RedirectResponse("/", status_code=303)
            nonce = secrets.token_urlsafe(24)
            response: Response = render(
                request, "login.html", nonce=nonce, next=_safe_next(next_url)
            )
            response.set_cookie(
                LOGIN_COOKIE, nonce, httponly=True, samesite="strict", secure=_secure(request)
            )
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response
        form = await request.form()
        if cfg.trusted_header:
            return PlainTextResponse("sign in through the SSO proxy", status_code=403)
        sent, expected = form.get("csrf_token"), request.cookies.get(LOGIN_COOKIE, "")
        if not (
            isinstance(sent, str)
            and expected
            and hmac.compare_digest(sent.encode(), expected.encode())
        ):
            return render(
                request,
                "refused.html",
                403,
                title="refused",
                message="this form has no valid CSRF token: nothing was changed. Reload the "
                "sign-in page and submit it from there.",
            )
        name, password = str(form.get("name", "")), str(form.get("password", ""))
        operator = await run_in_threadpool(accounts.authenticate, name, password)
        if operator is None:
            log.warning("console: failed sign-in for %r from %s", name[:120], request.client)
            nonce = secrets.token_urlsafe(24)
            response = render(
                request,
                "login.html",
                401,
                nonce=nonce,
                next=_safe_next(str(form.get("next", "/"))),
                error="wrong name or password, or the account is disabled",
            )
            response.set_cookie(
                LOGIN_COOKIE, nonce, httponly=True, samesite="strict", secure=_secure(request)
            )
            return response
        token, _ = await run_in_threadpool(
            accounts.start_session, operator, lifetime=cfg.session_lifetime
        )
        response = RedirectResponse(_safe_next(str(form.get("next", "/"))), status_code=303)
        _set_session_cookie(request, response, token)
        response.delete_cookie(LOGIN_COOKIE)
        return response

    def logout(request: Request, auth: Auth, form: Any) -> Response:
        accounts.end_session(request.cookies.get(SESSION_COOKIE, ""))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # -- the queue ----------------------------------------------------------------------

    def queue(request: Request, auth: Auth) -> Response:
        params = request.query_params
        mine = my_tenants(auth)
        chosen = params.get("tenant", "").strip()
        if chosen:
            tenant_of(auth, chosen)
        tenants = [chosen] if chosen else mine
        action = params.get("action", "").strip() or None
        reason = params.get("reason", "").strip() or None
        age_text = params.get("age", "").strip()
        age = parse_age(age_text) if age_text else None
        rows = []
        counts: dict[str, dict[str, int]] = {"tenant": {}, "action": {}, "reason": {}}
        for tenant in tenants:
            for r in reviews.list(
                tenant=tenant, older_than=age, action=action, reason=reason, limit=1000
            ):
                rows.append(r)
            for c in reviews.counts(tenant=tenant):
                counts["tenant"][tenant] = counts["tenant"].get(tenant, 0) + c.n
                counts["action"][c.action] = counts["action"].get(c.action, 0) + c.n
                counts["reason"][c.reason] = counts["reason"].get(c.reason, 0) + c.n
        rows.sort(key=lambda r: (r.opened_at, r.op_id))
        now = datetime.now(UTC)
        return render(
            request,
            "queue.html",
            auth=auth,
            rows=rows,
            counts=counts,
            total=sum(counts["tenant"].values()),
            tenants=mine,
            filters={
                "tenant": chosen,
                "action": action or "",
                "reason": reason or "",
                "age": age_text,
            },
            ago=lambda t: _ago(t, now),
        )

    # -- one review ---------------------------------------------------------------------

    def review(request: Request, auth: Auth) -> Response:
        tenant = tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        try:
            view = reviews.show(op_id, tenant=tenant, operator=auth.operator.name)
        except ReviewAlreadyResolved as exc:
            raise Refusal(409, "already resolved", str(exc), tenant=tenant, op_id=op_id) from exc
        payload = reviews.payload(op_id, tenant=tenant)
        shown_payload, hidden = (
            cfg.redaction.apply(view.operation.action, payload)
            if payload is not None
            else (None, [])
        )
        no_dedup = view.contract is not None and view.contract.idempotency.kind == "none"
        return render(
            request,
            "review.html",
            auth=auth,
            tenant=tenant,
            view=view,
            op=view.operation,
            payload=shown_payload,
            hidden=hidden,
            facts=contract_facts(view.contract) if view.contract else [],
            no_dedup=no_dedup,
            hint=view.review.snapshot.get("search_hint"),
        )

    def resolve(request: Request, auth: Auth, form: Any) -> Response:
        tenant = tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        back = {"tenant": tenant, "op_id": op_id}
        choice = str(form.get("resolution", ""))
        try:
            seen_version = int(str(form.get("seen_version", "")))
        except ValueError:
            raise Refusal(
                400, "refused", "the form does not say which view it was made from: reload it"
            ) from None
        evidence = str(form.get("evidence", "")).strip() or None
        try:
            after = reviews.resolve(
                op_id,
                tenant=tenant,
                operator=auth.operator.name,  # the session's operator, never a form field
                resolution=choice,
                note=str(form.get("note", "")),
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
            why = publish_retry(op_id) if publish_retry is not None else "no broker configured"
            done["published"] = "yes" if why is None else "no"
        url = f"/t/{quote(tenant, safe='')}/ops/{op_id}/audit?{urlencode(done)}"
        return RedirectResponse(url, status_code=303)

    # -- the audit trail, operations, search --------------------------------------------

    def audit(request: Request, auth: Auth) -> Response:
        tenant = tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        history = reviews.history(op_id, tenant=tenant)
        actions = reviews.audit(op_id, tenant=tenant)
        return render(
            request,
            "audit.html",
            auth=auth,
            tenant=tenant,
            op=history.operation,
            history=history,
            actions=actions,
            done=request.query_params.get("done"),
            published=request.query_params.get("published"),
        )

    def operation(request: Request, auth: Auth) -> Response:
        tenant = tenant_of(auth, request.path_params["tenant"])
        op_id = request.path_params["op_id"]
        history = reviews.history(op_id, tenant=tenant)
        payload = reviews.payload(op_id, tenant=tenant)
        shown, hidden = (
            cfg.redaction.apply(history.operation.action, payload)
            if payload is not None
            else (None, [])
        )
        open_review = history.open_review is not None
        return render(
            request,
            "operation.html",
            auth=auth,
            tenant=tenant,
            op=history.operation,
            history=history,
            payload=shown,
            hidden=hidden,
            open_review=open_review and history.operation.status is Status.UNKNOWN,
        )

    def search(request: Request, auth: Auth) -> Response:
        params = request.query_params
        by = params.get("by", "id")
        value = params.get("q", "").strip()
        chosen = params.get("tenant", "").strip()
        mine = my_tenants(auth)
        if chosen:
            tenant_of(auth, chosen)
        results: list[Operation] = []
        if value:
            if by not in ("id", "workflow", "target"):
                raise InvalidInput("search by id, workflow or target", field="by")
            for tenant in [chosen] if chosen else mine:
                results.extend(
                    reviews.search(
                        tenant=tenant,
                        op_id=value if by == "id" else None,
                        workflow_id=value if by == "workflow" else None,
                        target=value if by == "target" else None,
                    )
                )
        return render(
            request,
            "search.html",
            auth=auth,
            results=results,
            by=by,
            q=value,
            tenant=chosen,
            tenants=mine,
        )

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    static = StaticFiles(directory=str(files("opledger.console") / "static"))
    routes = [
        Route("/healthz", health),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", form_page(logout), methods=["POST"]),
        Route("/", page(queue)),
        Route("/search", page(search)),
        Route("/t/{tenant}/ops/{op_id}", page(operation)),
        Route("/t/{tenant}/ops/{op_id}/review", page(review)),
        Route("/t/{tenant}/ops/{op_id}/resolve", form_page(resolve), methods=["POST"]),
        Route("/t/{tenant}/ops/{op_id}/audit", page(audit)),
        Mount("/static", app=static, name="static"),
    ]
    return Starlette(routes=routes)


def _safe_next(url: str) -> str:
    """Only a path on this site (never another host) after signing in."""
    if not url.startswith("/") or url.startswith("//") or "\\" in url:
        return "/"
    return url


__all__: Sequence[str] = ("ConsoleConfig", "create_app", "parse_age")
