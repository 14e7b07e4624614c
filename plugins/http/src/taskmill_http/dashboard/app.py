"""The dashboard at ``/ui``: server-rendered pages over the service's own scoping.

Sign-in is by token: a form posts it once, and the session (a cookie signed by
Starlette's ``SessionMiddleware``, ``SameSite=Strict``, ``HttpOnly``) keeps only the
token's fingerprint, never the token; every request looks the caller up again, so a
token removed from the tokens file ends its sessions at the next restart. Each page
reads through ``Service.operations(caller)`` — ``tm.for_app(app)`` for an app token,
``tm`` for an admin — exactly as the API does.

Every action is a POST carrying the session's CSRF token; the destructive ones
(cancel, preempt, suspend) answer with a confirmation page first. Every response carries
a content security policy that allows only the package's own script and stylesheet.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from taskmill.errors import InvalidCursor, TaskmillError
from taskmill.model import Task, TaskFilter, TaskStatus, attempt_runs

from taskmill_http import requests as rq
from taskmill_http.calls import Service
from taskmill_http.dashboard import bulk
from taskmill_http.dashboard.charts import charts
from taskmill_http.dashboard.listing import HOST_APP, ListQuery, list_page
from taskmill_http.dashboard.overview import (
    MAX_APPS,
    SPLIT_APPS,
    app_choices,
    overview,
)
from taskmill_http.dashboard.workers import has_registry, unserved_keys, worker_rows
from taskmill_http.errors import ServiceError, status_of
from taskmill_http.metrics import WINDOW_MINUTES
from taskmill_http.tokens import Caller

SESSION_COOKIE = "taskmill_ui"
"""The name of the dashboard's session cookie."""
SESSION_MAX_AGE = 12 * 3600
"""Seconds a sign-in lasts."""
MAX_FORM_BYTES = 64 * 1024

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
_HERE = Path(__file__).parent
WORKERS_REFRESH_SECONDS = 3
"""How often the workers page reloads its table in place (heartbeats are no events)."""
CHARTS_REFRESH_SECONDS = 5
"""How often the charts page redraws its charts in place."""
_ERROR_EXCERPT_LINES = 12


class SecurityHeaders:
    """ASGI middleware: the CSP and related headers on every dashboard response, and a
    ``Server-Timing: app;dur=MS`` header (the time until the response started: the
    page's whole server time, as the benchmark and a browser's developer tools read
    it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        began = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in _SECURITY_HEADERS if n not in names]
                elapsed = (time.perf_counter() - began) * 1000
                extra.append((b"server-timing", f"app;dur={elapsed:.2f}".encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _iso(value: dt.datetime | None) -> str:
    return "" if value is None else value.isoformat()


def _error_excerpt(error: str | None) -> str | None:
    """The last lines of a long error (where a traceback ends), or None if it is short."""
    if error is None:
        return None
    lines = error.rstrip().splitlines()
    if len(lines) <= _ERROR_EXCERPT_LINES:
        return None
    return "\n".join(lines[-_ERROR_EXCERPT_LINES:])


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["iso"] = _iso
    env.filters["pretty"] = _pretty
    env.filters["excerpt"] = _error_excerpt
    env.filters["datetime"] = lambda seconds: dt.datetime.fromtimestamp(seconds, dt.UTC)
    env.globals["STATUSES"] = list(TaskStatus)
    return env


class Dashboard:
    """The pages and actions of one service's dashboard."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.templates = _environment()

    async def start(self) -> None:
        """Start what the dashboard reads in the background: the service's metrics
        collector (the service's startup does it; starting it twice is harmless)."""
        await self.service.metrics.start()

    async def close(self) -> None:
        """Nothing of its own to stop: the service stops its metrics collector."""

    # -- who is asking ------------------------------------------------------------

    def caller(self, request: Request) -> Caller | None:
        """The signed-in caller, or None."""
        fingerprint = request.session.get("who")
        if not isinstance(fingerprint, str):
            return None
        return self.service.tokens.caller_by_fingerprint(fingerprint)

    @staticmethod
    def csrf_token(request: Request) -> str:
        """The session's CSRF token (made on first use), which every form carries."""
        token = request.session.get("csrf")
        if not isinstance(token, str):
            token = request.session["csrf"] = secrets.token_urlsafe(32)
        return token

    @staticmethod
    def here(request: Request) -> str:
        """The path and query of this request (where a form goes back to)."""
        query = request.url.query
        return request.url.path + (f"?{query}" if query else "")

    @staticmethod
    def base(request: Request) -> str:
        """The dashboard's own URL path (where it is mounted)."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def local_path(self, request: Request, target: str | None) -> str:
        """``target`` when it is a path inside the dashboard (never another site)."""
        base = self.base(request)
        if (
            target
            and target.startswith(base + "/")
            and not target.startswith("//")
            and not any(c in target for c in "\\\r\n")
        ):
            return target
        return base + "/"

    # -- rendering ----------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        caller: Caller | None,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        """``template`` with ``context`` and what every page shows (who is signed in,
        the CSRF token, the message of the last action)."""
        page = self.templates.get_template(template).render(
            base=self.base(request),
            caller=caller,
            csrf=self.csrf_token(request),
            flash=request.session.pop("flash", None),
            here=self.here(request),
            **({"events_url": None, "nav": ""} | context),
        )
        return HTMLResponse(page, status)

    def error_page(self, request: Request, caller: Caller | None, exc: TaskmillError) -> Response:
        """The page that answers ``exc``, with the status the API gives it."""
        status, code = status_of(exc)
        return self.render(
            request, "error.html", caller, status, status_code=status, code=code, message=str(exc)
        )

    def events_url(self, request: Request, filter: TaskFilter) -> str:
        """The URL of the live updates a page showing ``filter``'s tasks opens."""
        pairs: list[tuple[str, str]] = []
        if filter.app_id is not None:
            pairs.append(("app_id", filter.app_id))
        pairs.extend(("task_type", t) for t in filter.task_types or ())
        query = f"?{urlencode(pairs)}" if pairs else ""
        return f"{self.base(request)}/events{query}"

    # -- pages --------------------------------------------------------------------

    def page(
        self, view: Callable[[Request, Caller], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A page that needs a signed-in caller: others go to the sign-in form."""

        async def serve(request: Request) -> Response:
            caller = self.caller(request)
            if caller is None:
                back = quote(self.here(request), safe="")
                login = f"{self.base(request)}/login?next={back}"
                return RedirectResponse(login, 303)
            try:
                return await view(request, caller)
            except TaskmillError as exc:
                return self.error_page(request, caller, exc)

        return serve

    async def login_form(self, request: Request) -> Response:
        """``GET /login``: the sign-in form."""
        target = self.local_path(request, request.query_params.get("next"))
        return self.render(request, "login.html", self.caller(request), next=target, failed=False)

    async def login(self, request: Request) -> Response:
        """``POST /login``: a known token starts a new session (its fingerprint, a new
        CSRF token); an unknown one gets the form again with 401."""
        form = await self.form(request, check_csrf=True)
        target = self.local_path(request, form.get("next"))
        token = form.get("token", "").strip()
        fingerprint = self.service.tokens.fingerprint(token) if token else None
        if fingerprint is None:
            return self.render(request, "login.html", None, 401, next=target, failed=True)
        request.session.clear()
        request.session["who"] = fingerprint
        request.session["csrf"] = secrets.token_urlsafe(32)
        return RedirectResponse(target, 303)

    async def logout(self, request: Request) -> Response:
        """``POST /logout``: ends the session."""
        await self.form(request, check_csrf=True)
        request.session.clear()
        return RedirectResponse(f"{self.base(request)}/login", 303)

    async def overview_page(self, request: Request, caller: Caller) -> Response:
        """``GET /``: counts, throughput, suspensions, the newest external jobs."""
        await self.start()  # already running, unless mounted without its startup
        ops = self.service.operations(caller)
        found = await overview(self.service.tm, ops, caller, self.service.metrics)
        jobs = self.service.jobs.list(caller.app_id, every_app=caller.is_admin)[:10]
        return self.render(
            request,
            "overview.html",
            caller,
            nav="overview",
            overview=found,
            host_app=HOST_APP,
            max_apps=MAX_APPS,
            split_apps=SPLIT_APPS,
            jobs=jobs,
            events_url=self.events_url(request, TaskFilter(app_id=caller.app_id)),
        )

    async def tasks_page(self, request: Request, caller: Caller) -> Response:
        """``GET /tasks``: one keyset page of the filtered list, external jobs beside."""
        query = ListQuery.from_request(request, caller)
        ops = self.service.operations(caller)
        page = await list_page(ops, query)
        choices = await app_choices(self.service.tm, ops, caller)
        base = self.base(request)
        next_url = None
        if page.next_cursor is not None:
            next_url = f"{base}/tasks?{query.query_string(cursor=page.next_cursor)}"
        first_url = f"{base}/tasks?{query.query_string()}" if query.cursor else None
        jobs = self.service.jobs.list(caller.app_id, every_app=caller.is_admin)[:20]
        retry_all = await bulk.retry_count(ops, query) if bulk.retryable(query) else None
        unserved = await unserved_keys(
            self.service.tm,
            {(t.app_id, t.task_type) for t in page.tasks if t.status is TaskStatus.PENDING},
        )
        return self.render(
            request,
            "tasks.html",
            caller,
            nav="tasks",
            query=query,
            apps=choices,
            host_app=HOST_APP,
            max_apps=MAX_APPS,
            retry_all=retry_all,
            bulk_max=bulk.BULK_MAX,
            tasks=page.tasks,
            unserved=unserved,
            next_url=next_url,
            first_url=first_url,
            jobs=jobs,
            events_url=self.events_url(request, query.event_filter()),
        )

    async def task_page(self, request: Request, caller: Caller) -> Response:
        """``GET /tasks/{id}``: the task, its attempts, children and aliases (404 for a
        task the caller may not see)."""
        task_id = str(request.path_params["task_id"])
        rq.check_identifier("task_id", task_id)
        ops = self.service.operations(caller)
        task = await ops.get(task_id)
        if task is None:
            raise ServiceError(404, "not_found", f"no task {task_id}")
        children = await ops.query(TaskFilter(parent_id=task.id), limit=200)
        aliases: list[Task] = []
        if task.dedupe_key is not None and task.alias_of is None:
            same_key = TaskFilter(
                app_id=task.app_id, task_types=(task.task_type,), dedupe_key=task.dedupe_key
            )
            aliases = [t for t in await ops.query(same_key, limit=200) if t.alias_of == task.id]
        attempts = await ops.attempts(task.id)
        runs = attempt_runs(attempts)
        return self.render(
            request,
            "task.html",
            caller,
            nav="tasks",
            task=task,
            attempts=list(zip(attempts, runs, strict=True)),
            runs=runs[-1] if runs else 0,
            children=children,
            aliases=aliases,
            events_url=self.events_url(request, TaskFilter(app_id=caller.app_id)),
        )

    async def workers_page(self, request: Request, caller: Caller) -> Response:
        """``GET /workers``: the registered workers the caller may see (an app token:
        those serving its app), live ones first, then the dead ones not yet pruned."""
        tm = self.service.tm
        registry = has_registry(tm)
        rows = await worker_rows(tm, self.service.operations(caller), caller) if registry else []
        return self.render(
            request,
            "workers.html",
            caller,
            nav="workers",
            registry=registry,
            store=type(tm.storage).__name__,
            workers=rows,
            refresh=WORKERS_REFRESH_SECONDS,
            events_url=self.events_url(request, TaskFilter(app_id=caller.app_id)),
        )

    async def charts_page(self, request: Request, caller: Caller) -> Response:
        """``GET /charts``: throughput, queue depth and latency of the last hour (or
        ``minutes``), as SVG drawn here, redrawn in place every
        :data:`CHARTS_REFRESH_SECONDS`; an admin picks an app (or every app), an app
        token sees its own."""
        await self.start()  # already running, unless mounted without its startup
        app_id = request.query_params.get("app_id", "").strip() or None
        rq.check_identifier("app_id", app_id)
        rq.ensure_own_app(caller.app_id, app_id)
        ops = self.service.operations(caller)
        choices = await app_choices(self.service.tm, ops, caller)
        minutes = rq.query_int(request, "minutes", WINDOW_MINUTES, 1, WINDOW_MINUTES)
        timeline = self.service.metrics.timeline(app_id or caller.app_id, minutes)
        return self.render(
            request,
            "charts.html",
            caller,
            nav="charts",
            app_id=app_id,
            apps=choices,
            max_apps=MAX_APPS,
            timeline=timeline,
            charts=charts(timeline),
            minutes=minutes,
            window=WINDOW_MINUTES,
            refresh=CHARTS_REFRESH_SECONDS,
        )

    async def jobs_page(self, request: Request, caller: Caller) -> Response:
        """``GET /jobs``: the external jobs the caller may see."""
        jobs = self.service.jobs.list(caller.app_id, every_app=caller.is_admin)
        return self.render(
            request,
            "jobs.html",
            caller,
            nav="jobs",
            jobs=jobs,
            events_url=self.events_url(request, TaskFilter(app_id=caller.app_id)),
        )

    async def events(self, request: Request) -> Response:
        """The live updates of a page: the service's event stream, for the session."""
        caller = self.caller(request)
        if caller is None:
            return Response("sign in first", 401, media_type="text/plain")
        try:
            app_id = rq.query_one(request, "app_id")
            rq.ensure_own_app(caller.app_id, app_id)
            types = tuple(rq.query_values(request, "task_type")) or None
            resume = request.headers.get("last-event-id") or rq.query_one(request, "since")
            hub = self.service.hub
            await hub.start()
            since = None if resume is None else await hub.resume_position(resume)
        except (ServiceError, InvalidCursor) as exc:
            return Response(str(exc), status_of(exc)[0], media_type="text/plain")
        filter = TaskFilter(app_id=app_id, task_types=types)
        frames = hub.stream(
            caller.app_id,
            None if filter == TaskFilter() else filter,
            since,
            heartbeat=self.service.limits.heartbeat_seconds,
        )

        async def with_retry() -> Any:
            yield "retry: 1000\n\n"  # reconnect after a second, not the default three
            async for frame in frames:
                yield frame

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(with_retry(), media_type="text/event-stream", headers=headers)

    # -- actions ------------------------------------------------------------------

    async def form(self, request: Request, *, check_csrf: bool) -> dict[str, str]:
        """The posted form (URL-encoded), its CSRF token checked.

        :raises HTTPException: 403 for a missing or wrong CSRF token, 413 for a form
            past :data:`MAX_FORM_BYTES`.
        """
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise HTTPException(413, "form too large")
        form: dict[str, str] = {}
        for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
            # A repeated field (the checked rows of "cancel selected") joins with commas.
            form[name] = f"{form[name]},{value}" if name in form else value
        if check_csrf:
            expected = request.session.get("csrf")
            if not isinstance(expected, str) or not secrets.compare_digest(
                expected, form.get("csrf", "")
            ):
                raise HTTPException(403, "the form is stale or forged: reload the page")
        return form

    def action(
        self,
        run: Callable[[Request, Caller, Mapping[str, str]], Awaitable[str]],
        *,
        confirm: Callable[[Request, Mapping[str, str]], str] | None = None,
        count: Callable[[Request, Caller, Mapping[str, str]], Awaitable[str]] | None = None,
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST action: signed in, CSRF-checked, confirmed first when ``confirm``
        describes it (or ``count``, which reads the store to say how many tasks change),
        then back to the page it came from with ``run``'s message."""

        async def serve(request: Request) -> Response:
            caller = self.caller(request)
            if caller is None:
                raise HTTPException(401, "sign in first")
            form = await self.form(request, check_csrf=True)
            back = self.local_path(request, form.get("back"))
            try:
                asks = confirm is not None or count is not None
                if asks and form.get("confirmed") != "yes":
                    fields = {k: v for k, v in form.items() if k not in ("csrf", "confirmed")}
                    if count is not None:
                        question = await count(request, caller, form)
                    else:
                        assert confirm is not None
                        question = confirm(request, form)
                    return self.render(
                        request,
                        "confirm.html",
                        caller,
                        question=question,
                        action=request.url.path,
                        fields=fields,
                        back=back,
                    )
                request.session["flash"] = await run(request, caller, form)
            except TaskmillError as exc:
                return self.error_page(request, caller, exc)
            return RedirectResponse(back, 303)

        return serve

    def _scope(self, caller: Caller, form: Mapping[str, str]) -> tuple[str | None, str | None]:
        task_type = form.get("task_type", "").strip() or None
        app_id = form.get("app_id", "").strip() or None
        rq.check_identifier("task_type", task_type)
        rq.check_identifier("app_id", app_id)
        rq.ensure_own_app(caller.app_id, app_id)
        # An app token's scope is its own app; tm.for_app stamps it.
        return task_type, None if caller.app_id is not None else app_id

    async def cancel(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Cancel the task of the URL (with ``cascade=yes``: its children and aliases)."""
        task_id = str(request.path_params["task_id"])
        cascade = form.get("cascade") == "yes"
        task = await self.service.operations(caller).cancel(task_id, cascade=cascade)
        return f"Task {task.id} is {task.status.value}."

    async def retry(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Put the FAILED or CANCELLED task of the URL back to PENDING."""
        task = await self.service.operations(caller).retry(str(request.path_params["task_id"]))
        return f"Task {task.id} is {task.status.value} again."

    async def suspend(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Suspend the form's scope (task type and, for an admin, app)."""
        task_type, app_id = self._scope(caller, form)
        interrupted = await self.service.operations(caller).suspend(task_type, app_id=app_id)
        return f"Suspended; {interrupted} running tasks interrupted and re-queued."

    async def resume(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Lift the suspension of the form's scope."""
        task_type, app_id = self._scope(caller, form)
        resumed = await self.service.operations(caller).resume(task_type, app_id=app_id)
        return "Resumed." if resumed else "That scope was not suspended."

    async def preempt(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Cancel the active tasks of the form's task type (and dedupe key) as PREEMPTED."""
        task_type, app_id = self._scope(caller, form)
        if task_type is None:
            raise ServiceError(422, "invalid_body", "preempt needs a task type")
        dedupe_key = form.get("dedupe_key", "").strip() or None
        count = await self.service.operations(caller).preempt(
            task_type, app_id=app_id, dedupe_key=dedupe_key
        )
        return f"Preempted {count} active tasks of {task_type}."

    async def retry_all(self, request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        """Redrive every FAILED or CANCELLED task of the list's filter (``filter``)."""
        query = bulk.list_query(form.get("filter", ""), caller)
        if not bulk.retryable(query):
            raise ServiceError(422, "invalid_body", "filter the list to failed or cancelled tasks")
        result = await bulk.retry_all(self.service.operations(caller), query)
        return result.message()

    async def cancel_selected(
        self, request: Request, caller: Caller, form: Mapping[str, str]
    ) -> str:
        """Cancel the selected tasks (``task_id``), their children and aliases too."""
        ids = bulk.selected_ids(form.get("task_id", ""))
        ops = self.service.operations(caller)
        roots, changed, skipped = await bulk.cancel_selected(ops, ids)
        text = f"Cancelled {changed} tasks ({roots} selected, with their children and aliases)"
        if skipped:
            text += f"; {skipped} selected tasks were not active (or not found): left as they were"
        return text + "."

    # -- confirmations: what a destructive action is about to do ---------------------

    async def confirm_retry_all(
        self, request: Request, caller: Caller, form: Mapping[str, str]
    ) -> str:
        """The question before "Retry all": how many tasks it redrives."""
        query = bulk.list_query(form.get("filter", ""), caller)
        targets, more = await bulk.retry_targets(self.service.operations(caller), query)
        which = " and ".join(s.value for s in query.statuses)
        first = f"the first {len(targets)} (oldest first) of more than" if more else ""
        aliases = sum(t.alias_of is not None for t in targets)
        note = (
            f" {aliases} of them are aliases, which are refused (retry their leader)."
            if aliases
            else ""
        )
        return (
            f"Retry {first} {len(targets)} {which} tasks of this list? They go back to "
            f"pending with a fresh attempt budget.{note}"
        ).replace("  ", " ")

    async def confirm_cancel_selected(
        self, request: Request, caller: Caller, form: Mapping[str, str]
    ) -> str:
        """The question before "Cancel selected": how many tasks change, cascade included."""
        ids = bulk.selected_ids(form.get("task_id", ""))
        tree, inactive = await bulk.cancel_tree(self.service.operations(caller), ids)
        roots = len(ids) - len(inactive)
        text = (
            f"Cancel {roots} selected tasks? With their active children and aliases, "
            f"{len(tree)} tasks will be cancelled."
        )
        if inactive:
            text += f" {len(inactive)} selected tasks are not active (or not found): left alone."
        return text

    @staticmethod
    def _scope_words(form: Mapping[str, str]) -> str:
        task_type = form.get("task_type", "").strip()
        app_id = form.get("app_id", "").strip()
        what = f"task type {task_type!r}" if task_type else "every task type"
        return f"{what} of app {app_id!r}" if app_id else what

    @staticmethod
    def confirm_cancel(request: Request, form: Mapping[str, str]) -> str:
        """The question before a cancel."""
        cascade = " and its children and aliases" if form.get("cascade") == "yes" else ""
        return f"Cancel task {request.path_params['task_id']}{cascade}?"

    def confirm_suspend(self, request: Request, form: Mapping[str, str]) -> str:
        """The question before a suspension."""
        return (
            f"Suspend {self._scope_words(form)}? Its running tasks are interrupted and "
            "re-queued, and nothing of it starts until it is resumed."
        )

    def confirm_preempt(self, request: Request, form: Mapping[str, str]) -> str:
        """The question before a preempt."""
        key = form.get("dedupe_key", "").strip()
        with_key = f" with dedupe key {key!r}" if key else ""
        return (
            f"Preempt every active task of {self._scope_words(form)}{with_key}? They are "
            "cancelled for good."
        )

    def routes(self) -> list[Route | Mount]:
        """The dashboard's routes, relative to where it is mounted."""
        return [
            Route("/", self.page(self.overview_page)),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/tasks", self.page(self.tasks_page)),
            Route(
                "/tasks/retry-all",
                self.action(self.retry_all, count=self.confirm_retry_all),
                methods=["POST"],
            ),
            Route(
                "/tasks/cancel-selected",
                self.action(self.cancel_selected, count=self.confirm_cancel_selected),
                methods=["POST"],
            ),
            Route("/tasks/{task_id}", self.page(self.task_page)),
            Route(
                "/tasks/{task_id}/cancel",
                self.action(self.cancel, confirm=self.confirm_cancel),
                methods=["POST"],
            ),
            Route("/tasks/{task_id}/retry", self.action(self.retry), methods=["POST"]),
            Route(
                "/suspend",
                self.action(self.suspend, confirm=self.confirm_suspend),
                methods=["POST"],
            ),
            Route("/resume", self.action(self.resume), methods=["POST"]),
            Route(
                "/preempt",
                self.action(self.preempt, confirm=self.confirm_preempt),
                methods=["POST"],
            ),
            Route("/jobs", self.page(self.jobs_page)),
            Route("/workers", self.page(self.workers_page)),
            Route("/charts", self.page(self.charts_page)),
            Route("/events", self.events),
            Mount("/static", StaticFiles(directory=_HERE / "static")),
        ]


def create_dashboard(service: Service, *, session_secret: str | None = None) -> Starlette:
    """The dashboard's ASGI app for ``service``; the service mounts it at ``/ui``.

    ``session_secret`` signs the session cookies; without one, a random key is made, and
    sessions last as long as this process.
    """
    dashboard = Dashboard(service)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = ServiceError(exc.status_code, "http", str(exc.detail))
        return dashboard.error_page(request, dashboard.caller(request), error)

    app = Starlette(
        routes=dashboard.routes(),
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=session_secret or secrets.token_urlsafe(32),
                session_cookie=SESSION_COOKIE,
                max_age=SESSION_MAX_AGE,
                same_site="strict",
                https_only=False,
            ),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.dashboard = dashboard
    return app
