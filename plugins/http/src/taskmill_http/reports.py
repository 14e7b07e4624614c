"""The reports of detached owners (an ``HttpHandler`` receiver that answered 202):
progress, which renews the lease, and the attempt's end, which the core stores as a
worker would (:meth:`taskmill.Taskmill.report_detached`). Every report is fenced by
the lease the receiver was sent; see docs/service.md, "Detached attempts (202)".
"""

from __future__ import annotations

from taskmill.model import CancelReason, Progress, Task, TaskStatus
from taskmill.storage import FinishKind, Lease, ProgressUpdate

from taskmill_http import requests as rq
from taskmill_http.bodies import ProgressReport, StatusReport
from taskmill_http.calls import Call
from taskmill_http.endpoints import get_task
from taskmill_http.errors import ServiceError
from taskmill_http.handler import parse_lease

REPORTED = {
    "completed": FinishKind.COMPLETE,
    "failed": FinishKind.FAIL,
    "retry": FinishKind.RETRY,
    "cancelled": FinishKind.CANCEL,
}
"""The finish each ``status`` of ``POST /v1/tasks/{id}/status`` asks for."""


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
    tm = call.service.tm
    held = await tm.storage.renew_leases([lease], call.limits.detached_lease_seconds)
    if task.id not in held:
        raise await _lost(call, task.id)
    stop = held[task.id]
    if stop is not None:
        # A suspension or shutdown: give the task back without spending the attempt.
        await tm.report_detached(lease, FinishKind.RELEASE, reason=stop)
        raise ServiceError(409, "cancelled", f"task {task.id} was asked to stop ({stop.value})")
    progress = None
    if body.done is not None:  # done, total and message are in range (ProgressReport)
        total = task.progress.total if body.total is None else body.total
        progress = Progress(done=body.done, total=total, message=body.message)
    data = None if body.data is None else {**task.data, **body.data}
    if progress is not None or data is not None:
        await tm.storage.save_progress([ProgressUpdate(lease=lease, progress=progress, data=data)])
    return await get_task(call)


async def report_status(call: Call) -> Task:
    body = rq.body_as(call.body, StatusReport)
    task, lease = await _held(call, body.lease)
    stored = await call.service.tm.report_detached(
        lease,
        REPORTED[body.status],
        result=body.result,
        error=body.error,
        retry_in=body.retry_in,
        retry_policy=call.service.retry_policy,
    )
    if stored is None:
        raise await _lost(call, task.id)
    return stored
