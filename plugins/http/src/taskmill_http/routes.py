"""The route table: every endpoint once, from which both the Starlette routes and the
OpenAPI document are built (so the document cannot drift from what is served).

The tables follow SPEC section 10 in the order of the OpenAPI document: the task
operations (:data:`TASK_ENDPOINTS`), the handlers registered in the store and the
reports of detached owners (:data:`HANDLER_ENDPOINTS`), the event stream and external
jobs (:data:`EVENT_ENDPOINTS`), then what the service observes: the workers and the
metrics of the last hour (:data:`OBSERVE_ENDPOINTS`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from taskmill.model import Attempt, SuspensionScope, Task
from taskmill.storage import HandlerRegistration

from taskmill_http import requests as rq
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
    ProgressReport,
    Published,
    ResumeResult,
    StatusReport,
    Summary,
    SuspendBody,
    SuspendResult,
    TaskPage,
    TaskSpecBody,
    WorkerList,
    anchored,
)
from taskmill_http.calls import Endpoint as Endpoint  # re-exported: their old home
from taskmill_http.calls import Handler as Handler
from taskmill_http.calls import Param as Param
from taskmill_http.calls import RawHandler as RawHandler
from taskmill_http.endpoints import (
    cancel_task,
    cancel_tasks,
    cleanup,
    complete_job,
    create_children,
    create_task,
    create_tasks,
    delete_handler,
    events,
    get_job,
    get_task,
    job_progress,
    list_handlers,
    list_jobs,
    list_tasks,
    list_workers,
    metrics_timeline,
    preempt,
    publish_app_event,
    put_handler,
    resume,
    retry_task,
    summary,
    suspend,
    suspensions,
    task_attempts,
    upsert_job,
)
from taskmill_http.jobs import CompleteJobBody, ExternalJob, ProgressBody, UpsertJobBody
from taskmill_http.metrics import WINDOW_MINUTES, Timeline
from taskmill_http.reports import report_progress, report_status


def path_params(request: Request) -> dict[str, str]:
    """The path parameters Starlette matched."""
    return dict(request.path_params)


def _text(name: str) -> dict[str, Any]:
    """The schema of the path or query parameter ``name``: a string without NUL of at
    most the length the service takes (the core's limit for a key)."""
    return rq.text_schema(name)


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
        {"type": "array", "items": {"type": "string", "pattern": anchored(rq.STATUS_LIST)}},
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
            Param(
                "limit",
                {"type": "integer", "minimum": 1},
                "page size (default 100; a larger one than the service serves is taken as"
                " its largest)",
            ),
            Param(
                "cursor",
                {**_name("cursor"), "pattern": anchored(rq.CURSOR)},
                "the next_cursor of the previous page (an opaque token: one of another"
                " shape is a 422, one whose task is gone a 410)",
            ),
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
        body=list[ChildSpecBody],
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
                "over it. A position the store did not write (made up, from another "
                "store, ahead of the store) is a 422 invalid_cursor; one of another "
                "shape a 422 invalid_query",
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
        errors=(404, 409),
    ),
    Endpoint(
        "GET",
        "/v1/external-jobs/{job_id}",
        get_job,
        "Get one external job (of the token's app; an admin token: of the host)",
        ExternalJob,
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
        errors=(404, 409),
    ),
    Endpoint(
        "POST",
        "/v1/external-jobs/{job_id}/complete",
        complete_job,
        "Report an external job's end",
        ExternalJob,
        body=CompleteJobBody,
        params=(JOB_ID,),
        errors=(404, 409),
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

OBSERVE_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/v1/workers",
        list_workers,
        "The workers registered in the store, live ones first (an app token sees those "
        "serving its app)",
        WorkerList,
        description="What `taskmill workers --json` and the dashboard's workers page show. "
        "An app token sees the workers with a handler of its app, or a host handler other "
        "than taskmill.group; of each, its app's and the host's handlers, and its app's "
        "running tasks. On a store without a worker registry: registry false, no workers.",
    ),
    Endpoint(
        "GET",
        "/v1/metrics/timeline",
        metrics_timeline,
        "Throughput per status, queue depth and start latency per minute, last hour",
        Timeline,
        params=(
            Param(
                "app_id",
                _name("app_id"),
                "only this app (an app token: its own, the default; an admin token: "
                "every app without it)",
            ),
            Param(
                "minutes",
                {"type": "integer", "minimum": 1},
                f"how many minutes, the current one last (default and most: "
                f"{WINDOW_MINUTES}; a larger number is taken as {WINDOW_MINUTES})",
            ),
        ),
        errors=(403,),
        description="Counted in memory by this service process from the store's event "
        "log since it started (the hour before backfilled from the stored tasks, "
        "capped); the queue depth is sampled from the store's counts. See "
        "docs/service.md, Metrics.",
    ),
)

ENDPOINTS: tuple[Endpoint, ...] = (
    *TASK_ENDPOINTS,
    *HANDLER_ENDPOINTS,
    *EVENT_ENDPOINTS,
    *OBSERVE_ENDPOINTS,
)
"""Every endpoint the service serves but its OpenAPI document."""
