"""The worker registry: every worker registers itself in the store and heartbeats, so
that any process sharing the store can list the live workers (``tm.workers()``,
``taskmill workers``, the dashboard's workers page) and see which task types no live
worker serves (docs/workers.md).

A store keeps each registration as opaque JSON text beside its heartbeat
(:meth:`taskmill.storage.TaskStorage.put_worker`, capability ``worker_registry``); this
module owns what the text holds (:class:`WorkerRecord`) and how a listing reads it
(:class:`WorkerStatus`):

- a worker writes its record when it starts, at every housekeeping round (every
  ``rescue_interval``, a third of the lease by default) and removes it when it stops;
- a worker is **alive** while its last heartbeat is younger than its lease (it renews
  leases faster than that); a worker that died without removing its record is listed
  as dead until its leases have been rescued, then pruned: a housekeeping round of any
  worker deletes the records whose heartbeat is older than :data:`PRUNE_AFTER_LEASES`
  leases;
- the record lists the handlers the worker serves, with their options (what a process
  without the handler, such as the HTTP service, may apply to the tasks it creates).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from importlib import metadata
from typing import Any, Final

import attrs

from taskmill.registry import Handler
from taskmill.storage import HandlerKey, StoredWorker, utcnow

__all__ = [
    "MAX_LISTED_TASKS",
    "PRUNE_AFTER_LEASES",
    "WorkerHandler",
    "WorkerRecord",
    "WorkerStatus",
    "record_json",
    "statuses",
    "unserved",
]

MAX_LISTED_TASKS: Final = 100
"""The most running task ids a record lists (the count is always whole)."""
PRUNE_AFTER_LEASES: Final = 3
"""A record whose heartbeat is this many of its leases old is pruned: its worker is
dead and its leases have long been rescued."""


@attrs.frozen
class WorkerHandler:
    """One handler a worker serves, with the options other processes may apply."""

    task_type: str
    app_id: str | None = None
    max_retries: int | None = None
    timeout: float | None = None
    concurrency: int | None = None
    batch: bool = False

    @property
    def key(self) -> HandlerKey:
        """``(app_id, task_type)``."""
        return (self.app_id, self.task_type)


@attrs.frozen
class WorkerRecord:
    """What a worker says of itself in the store."""

    id: str
    host: str
    pid: int
    version: str
    started_at: datetime
    lease_seconds: float
    concurrency: int
    busy: int
    """Slots running a task now."""
    handlers: tuple[WorkerHandler, ...]
    running: tuple[str, ...] = ()
    """The ids of the tasks it runs now (at most :data:`MAX_LISTED_TASKS`)."""
    queued: int = 0
    """Tasks claimed into its local queue, not started."""
    processed: int = 0


@attrs.frozen
class WorkerStatus:
    """A registered worker as a listing shows it."""

    record: WorkerRecord
    heartbeat_at: datetime
    alive: bool
    """Its last heartbeat is younger than its lease."""

    @property
    def id(self) -> str:
        """The worker's id."""
        return self.record.id


def handlers_of(registry: Iterable[Handler]) -> tuple[WorkerHandler, ...]:
    """The records of the handlers a worker serves."""
    return tuple(
        WorkerHandler(
            task_type=h.task_type,
            app_id=h.app_id,
            max_retries=h.max_retries,
            timeout=h.timeout,
            concurrency=h.concurrency,
            batch=h.batch is not None,
        )
        for h in sorted(registry, key=lambda h: (h.app_id or "", h.task_type))
    )


def version() -> str:
    """The installed taskmill's version."""
    try:
        return metadata.version("taskmill")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree
        return "unknown"


def new_record(
    worker_id: str,
    *,
    started_at: datetime,
    lease_seconds: float,
    concurrency: int,
    handlers: Sequence[WorkerHandler],
    running: Sequence[str] = (),
    queued: int = 0,
    processed: int = 0,
) -> WorkerRecord:
    """The record of a worker of this process."""
    return WorkerRecord(
        id=worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=version(),
        started_at=started_at,
        lease_seconds=lease_seconds,
        concurrency=concurrency,
        busy=len(running),
        handlers=tuple(handlers),
        running=tuple(running[:MAX_LISTED_TASKS]),
        queued=queued,
        processed=processed,
    )


def record_json(record: WorkerRecord) -> str:
    """The JSON text a store keeps for ``record``."""
    value = attrs.asdict(record, recurse=True)
    value["started_at"] = record.started_at.isoformat()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _record(text: str) -> WorkerRecord:
    value: dict[str, Any] = json.loads(text)
    value["started_at"] = datetime.fromisoformat(value["started_at"])
    value["handlers"] = tuple(WorkerHandler(**h) for h in value.get("handlers", ()))
    value["running"] = tuple(value.get("running", ()))
    known = attrs.fields_dict(WorkerRecord)
    return WorkerRecord(**{k: v for k, v in value.items() if k in known})


def statuses(stored: Sequence[StoredWorker], now: datetime | None = None) -> list[WorkerStatus]:
    """The listing of ``stored`` registrations at ``now`` (the store's clock, as
    near as this process knows it): live ones first, by start time; records this
    release cannot read are left out."""
    now = now or utcnow()
    found: list[WorkerStatus] = []
    for one in stored:
        try:
            record = _record(one.record)
        except (ValueError, TypeError, KeyError):
            continue  # a newer release's record: not ours to read
        alive = now - one.heartbeat_at < timedelta(seconds=record.lease_seconds)
        found.append(WorkerStatus(record=record, heartbeat_at=one.heartbeat_at, alive=alive))
    found.sort(key=lambda w: (not w.alive, w.record.started_at, w.id))
    return found


def unserved(task_types: Iterable[HandlerKey], workers: Sequence[WorkerStatus]) -> set[HandlerKey]:
    """The ``(app_id, task_type)`` keys among ``task_types`` that no live worker
    serves (a worker's host handler, app None, serves every app's tasks of its type)."""
    served: set[HandlerKey] = set()
    for worker in workers:
        if worker.alive:
            served.update(h.key for h in worker.record.handlers)
    return {key for key in task_types if key not in served and (None, key[1]) not in served}
