"""The console's web app: pages, forms and the guard in front of every request.

The guard (:class:`Guard`) lets a request through only when it carries the access token:
as ``?token=`` once (answered with a cookie and a redirect that drops it from the address),
then as that cookie (HttpOnly, SameSite=Strict, named after the port), or as
``Authorization: Bearer``. A POST that came with the cookie must also come from the
console's own pages: its ``Origin`` (or, without one, ``Sec-Fetch-Site``) must be this
origin, and its form must carry the token derived for forms. On loopback the ``Host``
header must be a loopback name (a DNS-rebinding page has another). Every answer forbids
framing, scripts and caching (``Content-Security-Policy``).

Values are shown through Jinja2's autoescaping, after control and bidi characters are made
visible as escapes (``render.escape``): a key such as ``<script>`` is text on the page.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from replaysafe_pg.cli import render
from replaysafe_pg.cli.console.reads import RESOLVE_STATES, Caller, Reader, timeline
from replaysafe_pg.errors import (
    AccessDenied,
    DatabaseUnavailable,
    InvalidArgument,
    ReplaysafeError,
    StaleStateError,
)
from replaysafe_pg.models import ActionState

LIST_LIMIT = 200
HISTORY_LIMIT = 20
CHECKPOINT_LIMIT = 50

# No script, no frame, no form to elsewhere, nothing from elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def _shown(value: Any) -> Any:
    """Every ``{{ value }}``: control and bidi characters as visible escapes, then Jinja2
    escapes HTML. Markup the templates build themselves passes as it is."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, timedelta):
        return render.duration(value)
    if isinstance(value, ActionState):
        return value.value
    return render.escape(str(value), keep_newlines=True)


def _json(value: Any) -> str:
    return json.dumps(render.jsonable(value), indent=2, ensure_ascii=False, sort_keys=True)


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("replaysafe_pg.cli.console", "templates"),
                      autoescape=True, finalize=_shown, trim_blocks=True, lstrip_blocks=True)
    env.filters["pretty"] = _json
    env.filters["q"] = lambda params: urlencode(
        {k: v for k, v in dict(params).items() if v is not None})
    return env


class Guard(BaseHTTPMiddleware):
    """The access token on every request, same-origin POSTs, a loopback Host on loopback,
    and the security headers on every answer."""

    def __init__(self, app: Any, *, token: str, port: int, loopback: bool) -> None:
        super().__init__(app)
        self.token = token
        self.cookie = f"replaysafe_console_{port}"
        self.loopback = loopback

    def _has(self, candidate: str | None) -> bool:
        return candidate is not None and secrets.compare_digest(candidate.encode(),
                                                                self.token.encode())

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._check(request, call_next)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _check(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        host = request.headers.get("host", "")
        if self.loopback and _hostname(host) not in LOOPBACK_HOSTS:
            return _refuse(400, "this console answers only on its loopback address")
        given = request.query_params.get("token")
        if given is not None:
            if not self._has(given) or request.method != "GET":
                return _refuse(401, "wrong access token")
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            answer = RedirectResponse(target, status_code=303)
            answer.set_cookie(self.cookie, self.token, httponly=True, samesite="strict",
                              path="/")
            return answer
        bearer = request.headers.get("authorization", "")
        by_header = bearer.startswith("Bearer ") and self._has(bearer.removeprefix("Bearer "))
        by_cookie = self._has(request.cookies.get(self.cookie))
        if not (by_header or by_cookie):
            return _refuse(401, "this console needs the access token it printed at start: open "
                                "the address it printed (…/?token=…)")
        if request.method not in ("GET", "HEAD") and not by_header:
            origin = request.headers.get("origin")
            fetch_site = request.headers.get("sec-fetch-site")
            own = f"{request.url.scheme}://{host}"
            if origin is not None and origin != own:
                return _refuse(403, "cross-site request refused")
            if origin is None and fetch_site not in ("same-origin", None):
                return _refuse(403, "cross-site request refused")
            if origin is None and fetch_site is None:
                return _refuse(403, "a form must be sent from the console's own page")
        request.state.form_token = form_token(self.token)
        request.state.by_header = by_header
        return await call_next(request)


def form_token(token: str) -> str:
    """The token every form of the console carries (derived: the access token itself never
    appears in a page)."""
    return hmac.new(token.encode(), b"replaysafe-console-form", hashlib.sha256).hexdigest()


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


def _refuse(status: int, why: str) -> Response:
    return PlainTextResponse(f"{why}\n", status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


class Console:
    """The pages. ``reader`` does every read and write, as the connected role."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.templates = Jinja2Templates(env=_environment())

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        caller: Caller | None = getattr(request.state, "caller", None)
        return self.templates.TemplateResponse(
            request, name, {"caller": caller, "form_token": request.state.form_token,
                            **context}, status_code=status)

    def guarded(self, handler: Handler) -> Handler:
        """``handler`` with the caller looked up first and the product's errors as pages."""
        async def run(request: Request) -> Response:
            try:
                request.state.caller = await run_in_threadpool(self.reader.caller)
                return await handler(request)
            except _BadForm as exc:
                return self.page(request, "error.html", 400, title="Not done", message=str(exc))
            except AccessDenied as exc:
                return self.page(request, "error.html", 403, title="Refused by the database",
                                 message=str(exc))
            except (InvalidArgument, StaleStateError) as exc:
                return self.page(request, "error.html", 400, title="Not done", message=str(exc))
            except DatabaseUnavailable as exc:
                return self.page(request, "error.html", 503, title="Database unavailable",
                                 message=str(exc))
            except ReplaysafeError as exc:
                return self.page(request, "error.html", 409, title="Not done",
                                 message=f"{type(exc).__name__}: {exc}")
            except LookupError as exc:
                return self.page(request, "error.html", 404, title="Not found", message=str(exc))
        return run

    # --- pages -------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        tenant = request.query_params.get("tenant") or None
        unresolved, multi, metrics = await run_in_threadpool(self._overview, tenant)
        return self.page(request, "overview.html", tenant=tenant, unresolved=unresolved,
                         multi=multi, metrics=metrics)

    def _overview(self, tenant: str | None) -> tuple[Any, Any, Any]:
        r = self.reader
        metrics = r.rows("metrics", by_tenant=True, tenant_id=tenant)
        by_tenant: dict[str, dict[str, float]] = {}
        for m in metrics:
            if m["name"] == "replaysafe_actions" and m["tenant_id"] is not None:
                by_tenant.setdefault(m["tenant_id"], {})[m["state"]] = m["value"]
        return (r.rows("unresolved_actions", tenant_id=tenant),
                r.rows("multi_effect_actions", tenant_id=tenant), by_tenant)

    async def actions(self, request: Request) -> Response:
        q = request.query_params
        filters = {"tenant": q.get("tenant") or None, "state": q.get("state") or None,
                   "operation": q.get("operation") or None, "thread": q.get("thread") or None}
        if filters["state"] is not None and filters["state"] not in {s.value for s in ActionState}:
            raise _BadForm(f"no state {filters['state']}")
        rows = await run_in_threadpool(
            self.reader.rows, "list_actions", tenant_id=filters["tenant"],
            states=[filters["state"]] if filters["state"] else [],
            operation=filters["operation"], thread_id=filters["thread"], older_than=None,
            limit=LIST_LIMIT)
        return self.page(request, "actions.html", rows=rows, filters=filters,
                         states=[s.value for s in ActionState], limit=LIST_LIMIT)

    async def action(self, request: Request) -> Response:
        tenant, key = _required(request.query_params, "tenant", "key")
        found = await run_in_threadpool(self.reader.action, tenant, key)
        if found is None:
            raise LookupError(f"no action {render.escape(key)} for tenant {render.escape(tenant)}")
        action, attempts = found
        return self.page(request, "action.html", action=action, attempts=attempts,
                         events=timeline(action, attempts), done=request.query_params.get("done"),
                         resolve_states=RESOLVE_STATES)

    async def resolve(self, request: Request) -> Response:
        form = await self._form(request)
        tenant, key, state, note = _required(form, "tenant", "key", "state", "note")
        if state not in RESOLVE_STATES:
            raise _BadForm(f"an unknown action is resolved as one of {', '.join(RESOLVE_STATES)}")
        # What the action turned out to be: a result for a success, an error otherwise.
        payload = _json_field(form, "result" if state == "succeeded" else "error")
        reference = str(form.get("provider_reference") or "").strip() or None
        new = await run_in_threadpool(
            lambda: self.reader.resolve(
                tenant, key, state, result=payload if state == "succeeded" else None,
                error=None if state == "succeeded" else payload,
                provider_reference=reference, note=note))
        return _back_to(tenant, key, f"resolved: unknown → {new.value}")

    async def reopen(self, request: Request) -> Response:
        form = await self._form(request)
        tenant, key, note = _required(form, "tenant", "key", "note")
        new = await run_in_threadpool(lambda: self.reader.reopen(tenant, key, note=note))
        return _back_to(tenant, key, f"reopened: failed → {new.value}")

    async def threads(self, request: Request) -> Response:
        tenant = request.query_params.get("tenant") or None
        rows = await run_in_threadpool(self.reader.rows, "console_threads", tenant_id=tenant,
                                       limit=LIST_LIMIT)
        return self.page(request, "threads.html", rows=rows, tenant=tenant, limit=LIST_LIMIT)

    async def thread(self, request: Request) -> Response:
        tenant, thread_id = _required(request.query_params, "tenant", "id")
        found = await run_in_threadpool(
            lambda: self.reader.thread(tenant, thread_id, history=HISTORY_LIMIT))
        if found is None:
            raise LookupError(f"no thread {render.escape(thread_id)} for tenant "
                              f"{render.escape(tenant)}")
        head, versions = found
        return self.page(request, "thread.html", head=head, versions=versions)

    async def langgraph(self, request: Request) -> Response:
        q = request.query_params
        tenant, thread_id = q.get("tenant") or "", q.get("id") or ""
        rows = None
        if tenant and thread_id:
            rows = await run_in_threadpool(
                lambda: self.reader.langgraph(tenant, thread_id, limit=CHECKPOINT_LIMIT))
        return self.page(request, "langgraph.html", tenant=tenant, thread_id=thread_id,
                         rows=rows, limit=CHECKPOINT_LIMIT)

    async def _form(self, request: Request) -> FormData:
        form = await request.form()
        # A client that sends the token itself (Authorization) is no page a site could
        # have made it submit; a browser's form must carry the form token.
        sent = str(form.get("form_token") or "").encode()
        if not request.state.by_header and not secrets.compare_digest(
                sent, request.state.form_token.encode()):
            raise _BadForm("this form did not come from the console's own page (reload it)")
        return form


class _BadForm(Exception):
    pass


def _required(values: Mapping[str, Any], *names: str) -> list[str]:
    got = []
    for name in names:
        value = values.get(name)
        if not isinstance(value, str) or not value.strip():
            raise _BadForm(f"{name} is required")
        got.append(value if name in ("key", "id", "tenant") else value.strip())
    return got


def _json_field(form: FormData, name: str) -> Any:
    text = str(form.get(name) or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _BadForm(f"{name} is not valid JSON ({exc}); nothing was changed") from None


def _back_to(tenant: str, key: str, done: str) -> Response:
    return RedirectResponse("/action?" + urlencode({"tenant": tenant, "key": key, "done": done}),
                            status_code=303)


async def _style(_request: Request) -> Response:
    css = (files("replaysafe_pg.cli.console") / "templates" / "console.css").read_text("utf-8")
    return Response(css, media_type="text/css")


def create_app(reader: Reader, *, token: str, port: int, loopback: bool) -> Starlette:
    """The console as an ASGI app: every route behind :class:`Guard` with ``token``."""
    console = Console(reader)
    g = console.guarded
    routes = [
        Route("/", g(console.overview)),
        Route("/actions", g(console.actions)),
        Route("/action", g(console.action)),
        Route("/action/resolve", g(console.resolve), methods=["POST"]),
        Route("/action/reopen", g(console.reopen), methods=["POST"]),
        Route("/threads", g(console.threads)),
        Route("/thread", g(console.thread)),
        Route("/langgraph", g(console.langgraph)),
        Route("/console.css", _style),
    ]
    return Starlette(routes=routes, middleware=[
        Middleware(Guard, token=token, port=port, loopback=loopback)])
