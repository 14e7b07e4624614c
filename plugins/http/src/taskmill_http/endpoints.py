"""What each endpoint of the service does: one small function per operation, taking
the authenticated :class:`~taskmill_http.calls.Call` and returning the response
body (:mod:`taskmill_http.routes` lists them; :mod:`taskmill_http.reports` holds the
reports of detached owners).
"""

from __future__ import annotations

from datetime import timedelta

from starlette.responses import Response, StreamingResponse
from taskmill import validation
from taskmill.model import Attempt, SuspensionScope, Task, TaskFilter, TaskSpec
from taskmill.serialization import to_dict
from taskmill.storage import HandlerRegistration

from taskmill_http import requests as rq
from taskmill_http.allowlist import HostNotAllowed
from taskmill_http.bodies import (
    AppEventBody,
    CancelBody,
    CancelledCount,
    ChildSpecBody,
    CleanupBody,
    Deleted,
    DeletedCount,
    FilterBody,
    HandlerBody,
    PreemptBody,
    Published,
    ResumeResult,
    Summary,
    SuspendBody,
    SuspendResult,
    TaskPage,
    TaskSpecBody,
    WorkerInfo,
    WorkerList,
)
from taskmill_http.calls import Call
from taskmill_http.dashboard.workers import has_registry, worker_rows
from taskmill_http.errors import ServiceError
from taskmill_http.events import APP_ENTITY, EXTERNAL_JOB_UPDATE
from taskmill_http.jobs import CompleteJobBody, ExternalJob, ProgressBody, UpsertJobBody
from taskmill_http.metrics import WINDOW_MINUTES, Timeline
from taskmill_http.tokens import Caller

# -- tasks -----------------------------------------------------------------------------


TRACE_HEADERS: tuple[str, ...] = ("traceparent", "tracestate", "baggage")
"""The request headers a created task keeps (``TaskSpec.headers``): the W3C trace
context, so that a trace in the caller continues into the task (docs/otel.md)."""


def _trace_headers(call: Call) -> dict[str, str] | None:
    headers = call.request.headers
    found = {name: headers[name] for name in TRACE_HEADERS if name in headers}
    return found or None


def _spec(caller: Caller, body: TaskSpecBody, headers: dict[str, str] | None = None) -> TaskSpec:
    # The values are checked by the core when it builds the task (taskmill.validation):
    # a refusal is an InvalidTaskSpec naming the field, answered as 422.
    return TaskSpec(
        headers=headers,
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


def _specs(call: Call, cls: type[TaskSpecBody] = TaskSpecBody) -> list[TaskSpec]:
    bodies = rq.list_body(call.body, cls, call.limits.max_items)
    rq.refuse_app_id(call.caller.app_id, [b.app_id for b in bodies])
    headers = _trace_headers(call)
    return [_spec(call.caller, b, headers) for b in bodies]


async def create_task(call: Call) -> Task:
    body = rq.body_as(call.body, TaskSpecBody)
    rq.refuse_app_id(call.caller.app_id, [body.app_id])
    spec = _spec(call.caller, body, _trace_headers(call))
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
    return await call.ops.batch_children(parent_id, _specs(call, ChildSpecBody))


async def cancel_tasks(call: Call) -> CancelledCount:
    body = rq.body_as(call.body, FilterBody)
    if body.all == body.selects_something():
        # {} must not mean "everything": that takes an explicit {"all": true}.
        raise ServiceError(
            422,
            "invalid_body",
            'name a filter (task_types, statuses, ...), or {"all": true} alone to '
            "cancel every active task",
            field="all",
        )
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


# -- events and external jobs -----------------------------------------------------------


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
    if body.user_id is not None:
        validation.check_key("user_id", body.user_id, validation.USER_ID_MAX)
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


async def get_job(call: Call) -> ExternalJob:
    return call.service.jobs.get(_named_app(call, None), call.path("job_id"))


async def list_jobs(call: Call) -> list[ExternalJob]:
    return call.service.jobs.list(call.caller.app_id, every_app=call.caller.is_admin)


# -- handlers registered in the store ----------------------------------------------------


def _handler_key(call: Call, named: str | None) -> tuple[str | None, str]:
    return _named_app(call, named), call.path("task_type")


async def put_handler(call: Call) -> HandlerRegistration:
    body = rq.body_as(call.body, HandlerBody)  # the URL's shape and the concurrency
    app_id, task_type = _handler_key(call, body.app_id)
    # Stored as it is, not through Taskmill.handler: the same checks of the options.
    validation.check_timeout(body.timeout)
    if body.max_retries is not None:
        validation.check_int("max_retries", body.max_retries, 0, validation.MAX_RETRIES_MAX)
    await _check_handler_host(call, body.url)
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


async def _check_handler_host(call: Call, url: str) -> None:
    """:raises ServiceError: 422 ``handler_host_not_allowed`` for a URL whose host the
    service's allow-list refuses (an address outside it, or a name that resolves to
    one). A name off the list that does not resolve here is left to the workers, which
    resolve it where they run and check it at every call (their network may know it)."""
    from taskmill_http.handler import url_route

    try:
        await url_route(call.service.handler_hosts, url)
    except HostNotAllowed as exc:
        raise ServiceError(422, "handler_host_not_allowed", str(exc), field="url") from None
    except OSError:
        pass


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


# -- workers and metrics -----------------------------------------------------------------


async def list_workers(call: Call) -> WorkerList:
    """The registered workers the token may see, as the dashboard's workers page lists
    them (an app token: those serving its app, its handlers and running tasks only)."""
    tm = call.service.tm
    if not has_registry(tm):
        return WorkerList(registry=False, workers=[])
    rows = await worker_rows(tm, call.ops, call.caller)
    workers = []
    for row in rows:
        record = row.status.record
        workers.append(
            WorkerInfo(
                id=record.id,
                alive=row.status.alive,
                host=record.host,
                pid=record.pid,
                version=record.version,
                started_at=record.started_at,
                heartbeat_at=row.status.heartbeat_at,
                heartbeat_age_seconds=round(row.heartbeat_age, 3),
                lease_seconds=record.lease_seconds,
                concurrency=record.concurrency,
                busy=record.busy,
                queued=record.queued,
                processed=record.processed,
                handlers=list(row.handlers),
                running=[t.id for t in row.tasks],
                running_not_shown=row.more_tasks,
            )
        )
    return WorkerList(registry=True, workers=workers)


async def metrics_timeline(call: Call) -> Timeline:
    """The last hour (or ``minutes``) of the service's metrics, of the token's app."""
    app_id = rq.query_one(call.request, "app_id")
    rq.ensure_own_app(call.caller.app_id, app_id)
    minutes = rq.query_int(call.request, "minutes", WINDOW_MINUTES, 1, WINDOW_MINUTES)
    await call.service.metrics.start()  # running since startup, unless mounted without it
    return call.service.metrics.timeline(app_id or call.caller.app_id, minutes)
