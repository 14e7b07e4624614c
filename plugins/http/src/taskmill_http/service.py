"""The ASGI app: SPEC section 10's task operations over HTTP, scoped by bearer token.

Every request is authenticated first (401 without a known token), then runs the same
operation as ``tm.for_app(app_id)`` for an app token, or as ``tm`` itself for an admin
token: a task of another app is 404, a filter naming another app is 403, an ``app_id``
in an app token's body is 422. Errors are ``{"error": {"code", "message"}}``, with the
refused ``field`` when there is one; bad input is never a 500. The values of a body are
the core's to check (:mod:`taskmill.validation`): its refusals are answered as 422.

Why one long module: it is the route table of SPEC section 10, one small handler per
endpoint in the order of the OpenAPI document; the bodies, errors, tokens, events and
jobs live in their own modules.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from taskmill import validation
from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.errors import TaskmillError
from taskmill.model import (
    Attempt,
    AttemptOutcome,
    CancelReason,
    Progress,
    SuspensionScope,
    Task,
    TaskFilter,
    TaskSpec,
    TaskStatus,
)
from taskmill.operations import TaskOperations
from taskmill.serialization import converter as model_converter
from taskmill.serialization import dumps, to_dict
from taskmill.storage import Finish, FinishKind, HandlerRegistration, Lease, ProgressUpdate, utcnow

from taskmill_http import requests as rq
from taskmill_http.bodies import (
    HANDLER_CONCURRENCY_MAX,
    AppEventBody,
    CancelBody,
    CancelledCount,
    CleanupBody,
    Deleted,
    DeletedCount,
    FilterBody,
    HandlerBody,
    PreemptBody,
    ProgressReport,
    Published,
    ResumeResult,
    StatusReport,
    Summary,
    SuspendBody,
    SuspendResult,
    TaskPage,
    TaskSpecBody,
)
from taskmill_http.coalescing import CreateCoalescer
from taskmill_http.errors import ServiceError, error_body, field_of, status_of
from taskmill_http.events import APP_ENTITY, EXTERNAL_JOB_UPDATE, EventHub
from taskmill_http.handler import parse_lease
from taskmill_http.jobs import (
    CompleteJobBody,
    ExternalJob,
    ExternalJobs,
    ProgressBody,
    UpsertJobBody,
)
from taskmill_http.routes import Endpoint, Param
from taskmill_http.stored import stored_handlers
from taskmill_http.tokens import Caller, Tokens

log = logging.getLogger("taskmill.http")


@attrs.frozen
class Limits:
    """What one request may ask of the service."""

    max_body_bytes: int = 8 * 1024 * 1024
    """The largest request body (413 past it)."""
    max_items: int = 1000
    """The most tasks one batch or children request creates, and the largest page of a
    listing (413 ``too_many_items`` past it)."""
    subscriber_queue: int = 1000
    """Events waiting for one event-stream subscriber; past it the subscriber is told
    to resume from its position and the stream ends."""
    heartbeat_seconds: float = 15.0
    """A comment line goes to an idle event stream this often, so that proxies keep it."""
    external_job_ttl: float = 3600.0
    """Seconds an external job is kept after its last update."""
    max_external_jobs: int = 10_000
    """External jobs one service process holds at most."""
    detached_lease_seconds: float = 30.0
    """Each report of a detached owner extends its lease to now + this."""


class Service:
    """The state behind one app: the ``Taskmill``, the tokens and the limits."""

    def __init__(self, tm: Taskmill, tokens: Tokens, limits: Limits) -> None:
        self.tm = tm
        self.tokens = tokens
        self.limits = limits
        self._handlers_started = False
        self.hub = EventHub(tm, queue_size=limits.subscriber_queue)
        """Fans the store's events (and in-memory ones) out to the event streams."""
        self.jobs = ExternalJobs(ttl=limits.external_job_ttl, max_jobs=limits.max_external_jobs)
        """The external jobs reported to this process."""
        self.handlers = stored_handlers(tm)
        """The handlers registered in the store, kept registered in ``tm``'s registry
        (so that enqueueing applies their options, and a worker of ``tm`` serves them)."""
        self.creates = CreateCoalescer(max_batch=limits.max_items)
        """Stores the single-task creates that arrive together with one call
        (``POST /v1/tasks``: see :mod:`taskmill_http.coalescing`)."""
        self.endpoints: tuple[Endpoint, ...] = ()
        """What the app serves (its route table; the OpenAPI document describes it)."""

    def authenticate(self, request: Request) -> Caller:
        """The caller the ``Authorization: Bearer`` header identifies.

        :raises ServiceError: 401 without a header, or with an unknown token.
        """
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ServiceError(401, "unauthorized", "send Authorization: Bearer <token>")
        caller = self.tokens.caller(token.strip())
        if caller is None:
            raise ServiceError(401, "unauthorized", "unknown token")
        return caller

    def operations(self, caller: Caller) -> TaskOperations:
        """The task operations of ``caller``: ``tm.for_app(app)``, or ``tm`` (admin)."""
        if caller.app_id is None:
            return self.tm
        return self.tm.for_app(caller.app_id)

    async def start(self) -> None:
        """Start keeping the stored handlers registered (the app's startup does it)."""
        if self.tm.storage.capabilities.handler_registrations:
            await self.handlers.start()
            self._handlers_started = True

    async def close(self) -> None:
        """Stop what the service runs in the background and end the event streams."""
        await self.creates.close()
        await self.hub.close()
        if self._handlers_started:
            self._handlers_started = False
            await self.handlers.stop()


@attrs.define
class Call:
    """One authenticated request, as an endpoint's handler sees it."""

    service: Service
    caller: Caller
    request: Request
    endpoint: Endpoint
    body: Any = None

    @property
    def ops(self) -> TaskOperations:
        return self.service.operations(self.caller)

    @property
    def limits(self) -> Limits:
        return self.service.limits

    def path(self, name: str) -> str:
        value = str(self.request.path_params[name])
        rq.check_identifier(name, value)
        return value

    def filter_from_query(self) -> TaskFilter:
        """The task filter of the query string, app-checked (403 for another app)."""
        request = self.request
        app_id = rq.query_one(request, "app_id")
        rq.ensure_own_app(self.caller.app_id, app_id)
        task_types = rq.query_values(request, "task_type")
        return TaskFilter(
            app_id=app_id,
            task_types=tuple(task_types) or None,
            statuses=rq.query_statuses(request),
            parent_id=rq.query_one(request, "parent_id"),
            user_id=rq.query_one(request, "user_id"),
            dedupe_key=rq.query_one(request, "dedupe_key"),
            created_after=rq.query_datetime(request, "created_after"),
            created_before=rq.query_datetime(request, "created_before"),
        )


def json_response(value: Any, status: int = 200) -> Response:
    """``value`` (taskmill models, attrs bodies, plain JSON) as a JSON response."""
    return Response(
        dumps(model_converter.unstructure(value)), status, media_type="application/json"
    )


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response:
    """The one error shape: ``{"error": {"code", "message"}}``, with ``"field"`` in
    ``error`` when one value was refused."""
    body = error_body(code, message, field)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(dumps(body), status, media_type="application/json", headers=headers)


# -- endpoint handlers ------------------------------------------------------------------


def _spec(caller: Caller, body: TaskSpecBody) -> TaskSpec:
    # The values are checked by the core when it builds the task (taskmill.validation):
    # a refusal is an InvalidTaskSpec naming the field, answered as 422.
    return TaskSpec(
        task_type=body.task_type,
        params=body.params,
        # Stamped here, as tm.for_app() would (an app token's body names none): the
        # operations then take the spec as it is instead of copying it.
        app_id=body.app_id if caller.is_admin else caller.app_id,
        priority=body.priority,
        dedupe_key=body.dedupe_key,
        run_at=body.run_at,
        delay=body.delay,
        parent_id=body.parent_id,
        max_retries=body.max_retries,
        user_id=body.user_id,
    )


def _specs(call: Call) -> list[TaskSpec]:
    bodies = rq.list_body(call.body, TaskSpecBody, call.limits.max_items)
    rq.refuse_app_id(call.caller.app_id, [b.app_id for b in bodies])
    return [_spec(call.caller, b) for b in bodies]


async def create_task(call: Call) -> Task:
    body = rq.body_as(call.body, TaskSpecBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    spec = _spec(call.caller, body)
    return await call.service.creates.enqueue(call.ops, spec)


async def create_tasks(call: Call) -> list[Task]:
    return await call.ops.enqueue_many(_specs(call))


async def get_task(call: Call) -> Task:
    task_id = call.path("task_id")
    task = await call.ops.get(task_id)
    if task is None:
        raise ServiceError(404, "not_found", f"no task {task_id}")
    return task


async def list_tasks(call: Call) -> TaskPage:
    filter = call.filter_from_query()
    limit = rq.query_int(call.request, "limit", 100, 1, call.limits.max_items)
    after = rq.decode_cursor(call.request)
    tasks = await call.ops.query(filter, limit=limit + 1, after=after)
    if not tasks and after is not None and await call.ops.get(after) is None:
        # The page's anchor task was deleted (cleanup) after the cursor was handed out:
        # an empty page would silently end the listing, so say so instead.
        raise ServiceError(
            410,
            "cursor_expired",
            "the task this cursor continues from was deleted (cleanup); "
            "list again without a cursor",
        )
    more = len(tasks) > limit
    page = tasks[:limit]
    return TaskPage(tasks=page, next_cursor=rq.encode_cursor(page[-1].id) if more else None)


async def cancel_task(call: Call) -> Task:
    task_id = call.path("task_id")
    body = CancelBody() if call.body is None else rq.body_as(call.body, CancelBody)
    return await call.ops.cancel(task_id, reason=body.reason, cascade=body.cascade)


async def retry_task(call: Call) -> Task:
    return await call.ops.retry(call.path("task_id"))


async def task_attempts(call: Call) -> list[Attempt]:
    task = await get_task(call)
    return await call.ops.attempts(task.id)


async def create_children(call: Call) -> list[Task]:
    parent_id = call.path("task_id")
    return await call.ops.batch_children(parent_id, _specs(call))


async def cancel_tasks(call: Call) -> CancelledCount:
    body = rq.body_as(call.body, FilterBody)
    rq.ensure_own_app(call.caller.app_id, body.app_id)
    filter = TaskFilter(
        app_id=body.app_id,
        task_types=tuple(body.task_types) if body.task_types is not None else None,
        statuses=tuple(body.statuses) if body.statuses is not None else None,
        parent_id=body.parent_id,
        user_id=body.user_id,
        dedupe_key=body.dedupe_key,
        created_after=body.created_after,
        created_before=body.created_before,
    )
    count = await call.ops.cancel_by_filter(filter, reason=body.reason, cascade=body.cascade)
    return CancelledCount(cancelled=count)


async def summary(call: Call) -> Summary:
    found = await call.ops.progress_summary(call.filter_from_query())
    return Summary(
        total=found.total,
        pending=found.pending,
        running=found.running,
        completed=found.completed,
        failed=found.failed,
        cancelled=found.cancelled,
        pct=found.pct,
    )


async def cleanup(call: Call) -> DeletedCount:
    body = rq.body_as(call.body, CleanupBody)
    rq.check_seconds("older_than_seconds", body.older_than_seconds, low=0)
    deleted = await call.service.tm.cleanup(
        timedelta(seconds=body.older_than_seconds), include_failed=body.include_failed
    )
    return DeletedCount(deleted=deleted)


async def preempt(call: Call) -> CancelledCount:
    body = rq.body_as(call.body, PreemptBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    count = await call.ops.preempt(body.task_type, app_id=body.app_id, dedupe_key=body.dedupe_key)
    return CancelledCount(cancelled=count)


async def suspend(call: Call) -> SuspendResult:
    body = SuspendBody() if call.body is None else rq.body_as(call.body, SuspendBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    return SuspendResult(interrupted=await call.ops.suspend(body.task_type, app_id=body.app_id))


async def resume(call: Call) -> ResumeResult:
    body = SuspendBody() if call.body is None else rq.body_as(call.body, SuspendBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    return ResumeResult(resumed=await call.ops.resume(body.task_type, app_id=body.app_id))


async def suspensions(call: Call) -> list[SuspensionScope]:
    return await call.ops.suspensions()


async def events(call: Call) -> Response:
    request = call.request
    filter = call.filter_from_query()
    resume = request.headers.get("last-event-id") or rq.query_one(request, "since")
    hub = call.service.hub
    await hub.start()
    since = None if resume is None else await hub.resume_position(resume)
    stream = hub.stream(
        call.caller.app_id,
        None if filter == TaskFilter() else filter,
        since,
        heartbeat=call.limits.heartbeat_seconds,
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


async def publish_app_event(call: Call) -> Published:
    body = rq.body_as(call.body, AppEventBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    rq.check_identifier("kind", body.kind)
    app_id = _named_app(call, body.app_id)
    data = {"app_id": app_id, "kind": body.kind, "scope": body.scope, "payload": body.payload}
    await call.service.hub.start()
    position = call.service.hub.publish(APP_ENTITY, app_id, data)
    return Published(position=str(position))


def _named_app(call: Call, named: str | None) -> str | None:
    """The token's app, or the app an admin token's body names (checked as the core
    checks every app id: this one reaches no operation of the core)."""
    rq.refuse_app_id(call.caller.app_id, [named])
    if call.caller.app_id is not None:
        return call.caller.app_id
    if named is not None:
        validation.check_key("app_id", named, validation.APP_ID_MAX)
    return named


def _published(call: Call, job: ExternalJob) -> ExternalJob:
    call.service.hub.publish(EXTERNAL_JOB_UPDATE, job.app_id, to_dict(job))
    return job


async def upsert_job(call: Call) -> ExternalJob:
    body = rq.body_as(call.body, UpsertJobBody)
    await call.service.hub.start()  # its position names the store's cursor
    app_id = _named_app(call, body.app_id)
    return _published(call, call.service.jobs.upsert(app_id, call.path("job_id"), body))


async def job_progress(call: Call) -> ExternalJob:
    body = rq.body_as(call.body, ProgressBody)
    await call.service.hub.start()  # its position names the store's cursor
    job_id = call.path("job_id")
    return _published(call, call.service.jobs.progress(_named_app(call, None), job_id, body))


async def complete_job(call: Call) -> ExternalJob:
    body = rq.body_as(call.body, CompleteJobBody)
    await call.service.hub.start()  # its position names the store's cursor
    job_id = call.path("job_id")
    return _published(call, call.service.jobs.complete(_named_app(call, None), job_id, body))


async def list_jobs(call: Call) -> list[ExternalJob]:
    return call.service.jobs.list(call.caller.app_id, every_app=call.caller.is_admin)


# -- handlers registered in the store ----------------------------------------------------


def _handler_key(call: Call, named: str | None) -> tuple[str | None, str]:
    return _named_app(call, named), call.path("task_type")


async def put_handler(call: Call) -> HandlerRegistration:
    body = rq.body_as(call.body, HandlerBody)
    app_id, task_type = _handler_key(call, body.app_id)
    if not body.url.startswith(("http://", "https://")) or len(body.url) > 2000:
        raise ServiceError(
            422, "invalid_body", "url must be an http:// or https:// URL", field="url"
        )
    # Stored as it is, not through Taskmill.handler: the same checks of the options.
    validation.check_timeout(body.timeout)
    if body.max_retries is not None:
        validation.check_int("max_retries", body.max_retries, 0, validation.MAX_RETRIES_MAX)
    rq.check_int("concurrency", body.concurrency, 1, HANDLER_CONCURRENCY_MAX)
    registration = HandlerRegistration(
        task_type=task_type,
        url=body.url,
        app_id=app_id,
        timeout=body.timeout,
        max_retries=body.max_retries,
        concurrency=body.concurrency,
    )
    stored = await call.service.tm.storage.put_handler_registration(registration)
    await call.service.handlers.refresh()
    return stored


async def list_handlers(call: Call) -> list[HandlerRegistration]:
    found = await call.service.tm.storage.handler_registrations()
    return [r for r in found if call.caller.is_admin or r.app_id == call.caller.app_id]


async def delete_handler(call: Call) -> Deleted:
    app_id, task_type = _handler_key(call, rq.query_one(call.request, "app_id"))
    deleted = await call.service.tm.storage.delete_handler_registration(app_id, task_type)
    if not deleted:
        raise ServiceError(404, "not_found", f"no handler registered for {task_type!r}")
    await call.service.handlers.refresh()
    return Deleted(deleted=True)


# -- reports of detached owners (HttpHandler's 202) ------------------------------------


async def _held(call: Call, lease_token: str) -> tuple[Task, Lease]:
    """The running task of the path and the lease the token stands for."""
    task = await get_task(call)
    lease = parse_lease(task.id, lease_token)
    if lease is None:
        raise ServiceError(422, "invalid_body", "lease is not a token this task was sent")
    return task, lease


async def _lost(call: Call, task_id: str) -> ServiceError:
    current = await call.service.tm.storage.get(task_id)
    if current is not None and current.status is TaskStatus.CANCELLED:
        reason = (current.cancel_reason or CancelReason.USER).value
        return ServiceError(409, "cancelled", f"task {task_id} was cancelled ({reason})")
    return ServiceError(
        409, "lease_lost", f"this attempt of task {task_id} no longer holds its lease"
    )


async def report_progress(call: Call) -> Task:
    body = rq.body_as(call.body, ProgressReport)
    task, lease = await _held(call, body.lease)
    storage = call.service.tm.storage
    held = await storage.renew_leases([lease], call.limits.detached_lease_seconds)
    if task.id not in held:
        raise await _lost(call, task.id)
    stop = held[task.id]
    if stop is not None:
        # A suspension or shutdown: give the task back without spending the attempt.
        now = utcnow()
        release = Finish(
            lease=lease,
            kind=FinishKind.RELEASE,
            outcome=AttemptOutcome.INTERRUPTED,
            started_at=task.started_at or now,
            finished_at=now,
            error=f"cancelled ({stop.value})",
        )
        (released,) = await storage.finish_batch([release])
        await _reported(call, release, released)
        raise ServiceError(409, "cancelled", f"task {task.id} was asked to stop ({stop.value})")
    progress = None
    if body.done is not None:
        if not rq.finite(body.done) or (body.total is not None and not rq.finite(body.total)):
            raise ServiceError(422, "invalid_body", "done and total must be finite numbers")
        if body.total is not None and body.total <= 0:
            raise ServiceError(422, "invalid_body", "total must be > 0")
        total = task.progress.total if body.total is None else body.total
        progress = Progress(done=body.done, total=total, message=body.message)
    data = None if body.data is None else {**task.data, **body.data}
    if progress is not None or data is not None:
        await storage.save_progress([ProgressUpdate(lease=lease, progress=progress, data=data)])
    return await get_task(call)


async def report_status(call: Call) -> Task:
    body = rq.body_as(call.body, StatusReport)
    task, lease = await _held(call, body.lease)
    rq.check_seconds("retry_in", body.retry_in, low=0)
    now = utcnow()
    result_json = None
    kind, outcome = _REPORTED[body.status]
    error = body.error
    retry_in = 0.0
    if kind is FinishKind.COMPLETE:
        result_json = dumps(body.result)
    elif kind is FinishKind.RETRY:
        error = error or "the receiver asked for a retry"
        if task.attempts > task.max_retries:
            kind = FinishKind.FAIL
            error = f"{error} (gave up after {task.attempts} attempts)"
        else:
            retry_in = (
                body.retry_in if body.retry_in is not None else RetryPolicy().delay(task.attempts)
            )
    elif kind is FinishKind.FAIL:
        error = error or "the receiver failed the task"
    finish = Finish(
        lease=lease,
        kind=kind,
        outcome=outcome,
        started_at=task.started_at or now,
        finished_at=now,
        result_json=result_json,
        error=error,
        retry_in=retry_in,
        cancel_reason=CancelReason.USER if kind is FinishKind.CANCEL else None,
    )
    (stored,) = await call.service.tm.storage.finish_batch([finish])
    if stored is None:
        raise await _lost(call, task.id)
    await _reported(call, finish, stored)
    return stored


async def _reported(call: Call, finish: Finish, stored: Task | None) -> None:
    """The lifecycle hooks of a detached attempt's end, in this process, which stored
    it (the worker that handed the attempt over called ``taskmill_task_detached``)."""
    plugins = call.service.tm.plugins
    if stored is None or not plugins.observes_finishes:
        return
    await plugins.attempt_finished(finish, stored)  # a failing hook is logged, no more


_REPORTED = {
    "completed": (FinishKind.COMPLETE, AttemptOutcome.COMPLETED),
    "failed": (FinishKind.FAIL, AttemptOutcome.FAILED),
    "retry": (FinishKind.RETRY, AttemptOutcome.FAILED),
    "cancelled": (FinishKind.CANCEL, AttemptOutcome.CANCELLED),
}


def _text(name: str) -> dict[str, Any]:
    """The schema of the path or query parameter ``name``: a string of at most the
    length the service takes (the core's limit for a key)."""
    return {"type": "string", "maxLength": rq.max_length(name)}


def _name(name: str) -> dict[str, Any]:
    """:func:`_text`, non-empty (a path segment, a task type)."""
    return {**_text(name), "minLength": 1}


TASK_ID = Param("task_id", _name("task_id"), "the task's id", where="path")
JOB_ID = Param(
    "job_id", _name("job_id"), "the external job's id (its owner's choice)", where="path"
)
TASK_TYPE = Param("task_type", _name("task_type"), "the task type the handler serves", where="path")
FILTER_PARAMS = (
    Param(
        "status",
        {"type": "array", "items": {"$ref": "#/components/schemas/TaskStatus"}},
        "only tasks in these statuses (repeat it, or separate with commas)",
        repeated=True,
    ),
    Param(
        "task_type",
        {"type": "array", "items": _text("task_type")},
        "only these task types (repeat it, or separate with commas)",
        repeated=True,
    ),
    Param("app_id", _name("app_id"), "only this app (an app token may name only its own)"),
    Param("parent_id", _name("parent_id"), "only children of this task"),
    Param("user_id", _name("user_id"), "only tasks this user asked for"),
    Param("dedupe_key", _name("dedupe_key"), "only tasks with this dedupe key"),
    Param(
        "created_after",
        {"type": "string", "format": "date-time"},
        "only tasks created after this moment",
    ),
    Param(
        "created_before",
        {"type": "string", "format": "date-time"},
        "only tasks created before this moment",
    ),
)

TASK_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/tasks",
        create_task,
        "Create one task",
        returns=Task,
        status=201,
        body=TaskSpecBody,
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks:batch",
        create_tasks,
        "Create many tasks at once (all or none)",
        returns=list[Task],
        status=201,
        body=list[TaskSpecBody],
        errors=(404,),
    ),
    Endpoint(
        "GET",
        "/v1/tasks",
        list_tasks,
        "List tasks, oldest first, a page at a time",
        returns=TaskPage,
        params=(
            *FILTER_PARAMS,
            Param("limit", {"type": "integer", "minimum": 1}, "page size (default 100)"),
            Param("cursor", _name("cursor"), "the next_cursor of the previous page"),
        ),
        errors=(403, 410),
    ),
    Endpoint(
        "GET",
        "/v1/tasks/{task_id}",
        get_task,
        "Get one task",
        Task,
        params=(TASK_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks/{task_id}/cancel",
        cancel_task,
        "Cancel a task (and, with cascade, its descendants)",
        Task,
        body=CancelBody,
        body_required=False,
        params=(TASK_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks/{task_id}/retry",
        retry_task,
        "Put a FAILED or CANCELLED task back to PENDING",
        Task,
        params=(TASK_ID,),
        errors=(404, 409),
    ),
    Endpoint(
        "GET",
        "/v1/tasks/{task_id}/attempts",
        task_attempts,
        "A task's execution log",
        list[Attempt],
        params=(TASK_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks/{task_id}/children",
        create_children,
        "Create children of a task (all or none)",
        list[Task],
        status=201,
        body=list[TaskSpecBody],
        params=(TASK_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks:cancel",
        cancel_tasks,
        "Cancel every active task a filter selects",
        CancelledCount,
        body=FilterBody,
        errors=(403,),
    ),
    Endpoint(
        "GET",
        "/v1/summary",
        summary,
        "Counts of tasks by status",
        Summary,
        params=FILTER_PARAMS,
        errors=(403,),
    ),
    Endpoint(
        "POST",
        "/v1/cleanup",
        cleanup,
        "Delete finished tasks older than a duration (admin tokens only)",
        DeletedCount,
        body=CleanupBody,
        admin_only=True,
        errors=(403,),
    ),
    Endpoint(
        "POST",
        "/v1/preempt",
        preempt,
        "Cancel the active tasks of a type as PREEMPTED",
        CancelledCount,
        body=PreemptBody,
    ),
    Endpoint(
        "POST",
        "/v1/suspend",
        suspend,
        "Stop claiming tasks of a scope, on every worker",
        SuspendResult,
        body=SuspendBody,
        body_required=False,
    ),
    Endpoint(
        "POST",
        "/v1/resume",
        resume,
        "Lift a suspension",
        ResumeResult,
        body=SuspendBody,
        body_required=False,
    ),
    Endpoint(
        "GET",
        "/v1/suspensions",
        suspensions,
        "The stored suspensions (an app token sees its app's)",
        list[SuspensionScope],
    ),
)

HANDLER_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "PUT",
        "/v1/handlers/{task_type}",
        put_handler,
        "Register (or replace) the HTTP handler of a task type, in the store",
        HandlerRegistration,
        body=HandlerBody,
        params=(TASK_TYPE,),
    ),
    Endpoint(
        "GET",
        "/v1/handlers",
        list_handlers,
        "The handlers registered in the store (an app token sees its app's)",
        list[HandlerRegistration],
    ),
    Endpoint(
        "DELETE",
        "/v1/handlers/{task_type}",
        delete_handler,
        "Remove a handler registered in the store",
        Deleted,
        params=(
            TASK_TYPE,
            Param("app_id", _name("app_id"), "the app of the handler (admin tokens only)"),
        ),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/tasks/{task_id}/progress",
        report_progress,
        "A detached owner reports progress (and renews its lease)",
        Task,
        body=ProgressReport,
        params=(TASK_ID,),
        errors=(404, 409),
    ),
    Endpoint(
        "POST",
        "/v1/tasks/{task_id}/status",
        report_status,
        "A detached owner reports the end of its attempt",
        Task,
        body=StatusReport,
        params=(TASK_ID,),
        errors=(404, 409),
    ),
)

EVENT_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/v1/events",
        events,
        "Live changes as Server-Sent Events",
        returns=str,
        media_type="text/event-stream",
        raw=True,
        params=(
            *FILTER_PARAMS,
            Param(
                "since",
                _name("since"),
                "resume after this position (an event id T.L, or T: a task event's "
                "cursor, an opaque token of the store); the Last-Event-ID header wins "
                "over it. A position the store did not write is a 422 invalid_cursor",
            ),
        ),
        errors=(403, 422),
        description="Events: job_update (a TaskEvent), external_job_update (an external "
        "job snapshot), app_entity (published with POST /v1/app-events); ready opens the "
        "stream and overflow ends it when the subscriber fell behind. Each event's id is "
        "its position: reconnect with Last-Event-ID to resume without a gap.",
    ),
    Endpoint(
        "PUT",
        "/v1/external-jobs/{job_id}",
        upsert_job,
        "Create or update an external job (a sidecar's own work)",
        ExternalJob,
        body=UpsertJobBody,
        params=(JOB_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/external-jobs/{job_id}/progress",
        job_progress,
        "Report an external job's progress",
        ExternalJob,
        body=ProgressBody,
        params=(JOB_ID,),
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/external-jobs/{job_id}/complete",
        complete_job,
        "Report an external job's end",
        ExternalJob,
        body=CompleteJobBody,
        params=(JOB_ID,),
        errors=(404,),
    ),
    Endpoint(
        "GET",
        "/v1/external-jobs",
        list_jobs,
        "The external jobs this service holds (an app token sees its app's)",
        list[ExternalJob],
    ),
    Endpoint(
        "POST",
        "/v1/app-events",
        publish_app_event,
        "Publish an app entity change on the event stream",
        Published,
        status=202,
        body=AppEventBody,
    ),
)


# -- the app ---------------------------------------------------------------------------


def _route(service: Service, endpoint: Endpoint) -> Route:
    async def serve(request: Request) -> Response:
        try:
            caller = Caller(None) if endpoint.public else service.authenticate(request)
            if endpoint.admin_only and not caller.is_admin:
                raise ServiceError(403, "admin_only", "this endpoint needs an admin token")
            call = Call(service, caller, request, endpoint)
            if endpoint.body is not None:
                call.body = await rq.read_json(
                    request, service.limits.max_body_bytes, required=endpoint.body_required
                )
            result = await endpoint.handler(call)
        except TaskmillError as exc:
            status, code = status_of(exc)
            if status >= 500:
                log.warning("%s %s: %s", request.method, request.url.path, exc)
            return error_response(status, code, str(exc), field_of(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, "internal", "the service failed; see its log")
        if endpoint.raw:
            assert isinstance(result, Response)
            return result
        return json_response(result, endpoint.status)

    return Route(endpoint.path, serve, methods=[endpoint.method], name=endpoint.operation_id)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, code, message)


def create_app(
    tm: Taskmill,
    tokens: Tokens | Mapping[str, str],
    *,
    limits: Limits | None = None,
    dashboard: bool = True,
    session_secret: str | None = None,
) -> Starlette:
    """The ASGI app of the service, for ``tm`` (an open ``Taskmill``, whose lifecycle
    stays the caller's) and ``tokens`` (a :class:`~taskmill_http.Tokens`, or a dict of
    token to app id or ``"*"``).

    Mount it in your own Starlette or FastAPI app, or serve it with uvicorn
    (``taskmill serve`` does). ``app.state.service`` is the :class:`Service` behind it.

    With ``dashboard`` (the default) the dashboard is served at ``/ui`` (see
    docs/dashboard.md); ``session_secret`` signs its session cookies (without one, a
    random key: sessions last as long as the process).
    """
    from taskmill_http.dashboard import create_dashboard
    from taskmill_http.openapi import openapi_endpoint

    if not isinstance(tokens, Tokens):
        tokens = Tokens(tokens)
    service = Service(tm, tokens, limits or Limits())
    endpoints = (*TASK_ENDPOINTS, *HANDLER_ENDPOINTS, *EVENT_ENDPOINTS)
    endpoints = (*endpoints, openapi_endpoint(endpoints))
    service.endpoints = endpoints

    routes: list[BaseRoute] = [_route(service, e) for e in endpoints]
    ui = create_dashboard(service, session_secret=session_secret) if dashboard else None
    if ui is not None:
        routes.append(Route("/ui", lambda request: RedirectResponse("ui/", 308)))
        routes.append(Mount("/ui", ui))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        if ui is not None:
            await ui.state.dashboard.start()
        try:
            yield
        finally:
            if ui is not None:
                await ui.state.dashboard.close()
            await service.close()

    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = service
    return app
