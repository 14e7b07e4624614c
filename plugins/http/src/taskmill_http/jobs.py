"""External jobs: snapshots of work a sidecar runs outside taskmill (the seed's
task_queue service), shown beside tasks.

They are kept in the service's memory, not in the store: a job is a sidecar's report of
its own work, not something taskmill runs, recovers or retries, and a report is
repeated by its owner anyway. Each job lives ``ttl`` seconds after its last update; at
most ``max_jobs`` are held (the expired ones go first). With several service replicas,
each replica knows the jobs reported to it: run one replica for them, or route a
sidecar's reports to one replica (sticky by app). A restart forgets them until their
owners report again.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Literal

import attrs
from taskmill.model import Progress, TaskStatus
from taskmill.storage import utcnow
from taskmill.validation import APP_ID_MAX, USER_ID_MAX

from taskmill_http.bodies import NUMBER_MAX, SECONDS_MAX, checked, key_limits
from taskmill_http.errors import ServiceError


@attrs.frozen
class ExternalJob:
    """A snapshot of one external job, as ``GET /v1/external-jobs`` and the
    ``external_job_update`` event show it."""

    job_id: str
    app_id: str | None
    title: str
    status: TaskStatus
    progress: Progress
    data: dict[str, Any]
    result: Any
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    user_id: str | None = None
    """Who asked for the job (its owner's word), like a task's ``user_id``."""
    eta_seconds: float | None = None
    """The owner's estimate of the seconds left, as of ``updated_at``."""


@attrs.frozen
class ProgressBody:
    """Progress of an external job: ``done`` of ``total``, with a message, and the
    owner's estimate of the seconds left. A field left out keeps its value (a new job:
    0 done, no total, no message, no estimate)."""

    done: float | None = attrs.field(
        default=None, metadata=checked(minimum=-NUMBER_MAX, maximum=NUMBER_MAX)
    )
    total: float | None = attrs.field(
        default=None, metadata=checked(exclusiveMinimum=0, maximum=NUMBER_MAX)
    )
    message: str | None = None
    eta_seconds: float | None = attrs.field(
        default=None, metadata=checked(minimum=0, maximum=SECONDS_MAX)
    )


@attrs.frozen
class UpsertJobBody:
    """Create or replace what is known of an external job (fields left out keep their
    value; a new job starts ``running`` with no progress)."""

    title: str | None = None
    status: TaskStatus | None = None
    progress: ProgressBody | None = None
    data: dict[str, Any] | None = None
    app_id: str | None = attrs.field(default=None, metadata=key_limits(APP_ID_MAX))
    user_id: str | None = attrs.field(default=None, metadata=key_limits(USER_ID_MAX))


@attrs.frozen
class CompleteJobBody:
    """The end of an external job."""

    status: Literal["completed", "failed", "cancelled"]
    result: Any = None
    error: str | None = None


def _progressed(job: ExternalJob, body: ProgressBody) -> ExternalJob:
    """``job`` with the progress fields ``body`` names (the others kept; their ranges
    were checked when the body was structured)."""
    eta = body.eta_seconds
    old = job.progress
    progress = Progress(
        done=old.done if body.done is None else body.done,
        total=old.total if body.total is None else body.total,
        message=old.message if body.message is None else body.message,
    )
    return attrs.evolve(job, progress=progress, eta_seconds=job.eta_seconds if eta is None else eta)


def _refuse_when_final(job: ExternalJob, what: str) -> None:
    """:raises ServiceError: 409 ``invalid_transition`` when ``job`` has ended."""
    if job.status.terminal:
        raise ServiceError(
            409,
            "invalid_transition",
            f"external job {job.job_id} is {job.status.value}, a final state: {what}",
        )


class ExternalJobs:
    """The external jobs this service process holds (see the module docstring)."""

    def __init__(self, *, ttl: float = 3600.0, max_jobs: int = 10_000) -> None:
        self.ttl = ttl
        self.max_jobs = max_jobs
        self._jobs: dict[tuple[str | None, str], tuple[float, ExternalJob]] = {}

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, (t, _) in self._jobs.items() if now - t > self.ttl]:
            del self._jobs[key]

    def get(self, app_id: str | None, job_id: str) -> ExternalJob:
        """:raises ServiceError: 404 when the job is unknown (or expired)."""
        self._expire()
        found = self._jobs.get((app_id, job_id))
        if found is None:
            raise ServiceError(404, "not_found", f"no external job {job_id}")
        return found[1]

    def list(self, app_id: str | None, *, every_app: bool) -> list[ExternalJob]:
        """The jobs of ``app_id`` (of every app with ``every_app``), newest update
        first."""
        self._expire()
        jobs = [j for _, j in self._jobs.values() if every_app or j.app_id == app_id]
        jobs.sort(key=lambda j: j.updated_at, reverse=True)
        return jobs

    def _store(self, job: ExternalJob) -> ExternalJob:
        key = (job.app_id, job.job_id)
        if key not in self._jobs and len(self._jobs) >= self.max_jobs:
            self._expire()
            if len(self._jobs) >= self.max_jobs:
                raise ServiceError(
                    413, "too_many_items", f"this service holds {self.max_jobs} external jobs"
                )
        self._jobs[key] = (time.monotonic(), job)
        return job

    def upsert(self, app_id: str | None, job_id: str, body: UpsertJobBody) -> ExternalJob:
        """Create the job, or update the fields ``body`` gives (progress: the fields it
        names).

        :raises ServiceError: 409 ``invalid_transition`` for a new status or progress of
            a job in a final state (completed, failed, cancelled).
        """
        self._expire()
        now = utcnow()
        found = self._jobs.get((app_id, job_id))
        if found is None:
            status = body.status or TaskStatus.RUNNING
            job = ExternalJob(
                job_id=job_id,
                app_id=app_id,
                title=body.title or job_id,
                status=status,
                progress=Progress(),
                data=body.data or {},
                result=None,
                error=None,
                created_at=now,
                updated_at=now,
                finished_at=now if status.terminal else None,
                user_id=body.user_id,
            )
        else:
            job = found[1]
            status = body.status or job.status
            if status != job.status or body.progress is not None:
                _refuse_when_final(job, "its status and progress no longer change")
            job = attrs.evolve(
                job,
                title=job.title if body.title is None else body.title,
                status=status,
                data=job.data if body.data is None else {**job.data, **body.data},
                user_id=job.user_id if body.user_id is None else body.user_id,
                updated_at=now,
                finished_at=(job.finished_at or now) if status.terminal else None,
            )
        if body.progress is not None:
            job = _progressed(job, body.progress)
        return self._store(job)

    def progress(self, app_id: str | None, job_id: str, body: ProgressBody) -> ExternalJob:
        """Record progress of a known, unfinished job (the fields ``body`` names).

        :raises ServiceError: 404 for an unknown job, 409 ``invalid_transition`` for a
            job in a final state.
        """
        job = self.get(app_id, job_id)
        _refuse_when_final(job, "it takes no more progress")
        return self._store(attrs.evolve(_progressed(job, body), updated_at=utcnow()))

    def complete(self, app_id: str | None, job_id: str, body: CompleteJobBody) -> ExternalJob:
        """Record the end of a known, unfinished job.

        :raises ServiceError: 404 for an unknown job, 409 ``invalid_transition`` for a
            job in a final state (it ends once).
        """
        job = self.get(app_id, job_id)
        _refuse_when_final(job, "it ends once")
        now = utcnow()
        return self._store(
            attrs.evolve(
                job,
                status=TaskStatus(body.status),
                result=body.result,
                error=body.error,
                updated_at=now,
                finished_at=now,
            )
        )
