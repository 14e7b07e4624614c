"""``Client``: the task operations of ``tm.for_app(...)``, over HTTP, on httpx.

The methods take the arguments of ``tm.for_app(app_id)``'s, return the same taskmill
models and raise the same taskmill exceptions (``TaskNotFound``, ``InvalidParams``,
``InvalidTaskSpec``, ``InvalidTransition``, ``InvalidCursor``, ``StorageUnavailable``,
``WaitTimeout``), mapped from the service's error codes. The app is the token's: it is never sent.

To follow a task you create, subscribe first, then create it: events are delivered from
the moment the stream is open, so a subscription opened after ``enqueue`` misses the
task's first events (its ``enqueued``, and on a fast worker more)::

    async with Client("http://127.0.0.1:8080", "s3cret-photos") as client:
        async with client.subscribe() as events:  # open: nothing from here is missed
            task = await client.enqueue("resize", {"path": "a.png"})
            async for event in events:
                if event.task.id != task.id:
                    continue
                print(event.kind, event.task.progress.pct)
                if event.status.terminal:
                    break
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx
from taskmill.errors import (
    StorageUnavailable,
    TaskNotFound,
    WaitTimeout,
)
from taskmill.model import (
    Attempt,
    CancelReason,
    Priority,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskSpec,
)
from taskmill.serialization import converter, dumps, loads

from taskmill_http.wire import filter_params as filter_params  # re-exported: their old home
from taskmill_http.wire import raise_for_error as raise_for_error

if TYPE_CHECKING:
    from taskmill_http.events_client import Subscription

TaskSpecLike = TaskSpec | Mapping[str, Any]


def _spec_body(value: TaskSpecLike) -> dict[str, Any]:
    spec = TaskSpec.from_value(value)
    body: dict[str, Any] = {"task_type": spec.task_type}
    for name in ("params", "app_id", "dedupe_key", "parent_id", "max_retries", "user_id"):
        if getattr(spec, name) is not None:
            body[name] = getattr(spec, name)
    if spec.priority != Priority.NORMAL:
        body["priority"] = int(spec.priority)
    if spec.run_at is not None:
        body["run_at"] = spec.run_at.isoformat()
    if spec.delay is not None:
        delay = spec.delay
        body["delay"] = delay.total_seconds() if isinstance(delay, timedelta) else delay
    return body


def _filter_body(filter: TaskFilter) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in ("app_id", "parent_id", "user_id", "dedupe_key"):
        if getattr(filter, name) is not None:
            body[name] = getattr(filter, name)
    if filter.task_types is not None:
        body["task_types"] = list(filter.task_types)
    if filter.statuses is not None:
        body["statuses"] = [s.value for s in filter.statuses]
    for name in ("created_after", "created_before"):
        moment: datetime | None = getattr(filter, name)
        if moment is not None:
            body[name] = moment.isoformat()
    return body


class Client:
    """The service's task operations for the app of ``token``, at ``base_url``.

    Use it as ``async with Client(url, token) as client:``, or call :meth:`aclose`. To
    see every event of a task, :meth:`subscribe` before creating it (see the module
    docstring).

    :param timeout: seconds for each request (the event stream waits without one).
    :param transport: an httpx transport (for tests, or to tune connections).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: list[tuple[str, str | int | float | bool | None]] | None = None,
    ) -> Any:
        content = None if json is None else dumps(json)
        headers = None if json is None else {"Content-Type": "application/json"}
        try:
            response = await self._http.request(
                method, path, content=content, params=params, headers=headers
            )
        except httpx.TransportError as exc:
            raise StorageUnavailable(
                f"cannot reach the taskmill service at {self.base_url}: {exc}"
            ) from exc
        raise_for_error(response)
        return loads(response.text) if response.content else None

    # -- enqueueing ------------------------------------------------------------------

    async def enqueue(
        self,
        task_type: str,
        params: dict[str, Any] | None = None,
        *,
        priority: int = Priority.NORMAL,
        dedupe_key: str | None = None,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
        parent_id: str | None = None,
        max_retries: int | None = None,
        user_id: str | None = None,
    ) -> Task:
        """Store a new task of this client's app (``AppTasks.enqueue``)."""
        spec = TaskSpec(
            task_type=task_type,
            params=params,
            priority=priority,
            dedupe_key=dedupe_key,
            run_at=run_at,
            delay=delay,
            parent_id=parent_id,
            max_retries=max_retries,
            user_id=user_id,
        )
        return converter.structure(
            await self._request("POST", "/v1/tasks", json=_spec_body(spec)), Task
        )

    async def enqueue_many(self, specs: Iterable[TaskSpecLike]) -> list[Task]:
        """Store many tasks in one request, all or none (``AppTasks.enqueue_many``)."""
        body = [_spec_body(s) for s in specs]
        if not body:
            return []
        return converter.structure(
            await self._request("POST", "/v1/tasks:batch", json=body), list[Task]
        )

    async def batch_children(self, parent_id: str, specs: Iterable[TaskSpecLike]) -> list[Task]:
        """Store children of ``parent_id`` (``AppTasks.batch_children``)."""
        body = [_spec_body(s) for s in specs]
        found = await self._request("POST", f"/v1/tasks/{parent_id}/children", json=body)
        return converter.structure(found, list[Task])

    # -- reading -----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The task's snapshot, or None (unknown, or another app's)."""
        try:
            found = await self._request("GET", f"/v1/tasks/{task_id}")
        except TaskNotFound:
            return None
        return converter.structure(found, Task)

    async def query(self, filter: TaskFilter | None = None, *, limit: int = 100) -> list[Task]:
        """Tasks ``filter`` selects, oldest first, at most ``limit`` (pages through the
        listing as needed)."""
        tasks: list[Task] = []
        cursor: str | None = None
        while len(tasks) < limit:
            params = filter_params(filter)
            params.append(("limit", str(min(1000, limit - len(tasks)))))
            if cursor is not None:
                params.append(("cursor", cursor))
            page = await self._request("GET", "/v1/tasks", params=params)
            tasks.extend(converter.structure(page["tasks"], list[Task]))
            cursor = page["next_cursor"]
            if cursor is None:
                break
        return tasks

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The task's execution log (empty for an unknown or foreign id)."""
        try:
            found = await self._request("GET", f"/v1/tasks/{task_id}/attempts")
        except TaskNotFound:
            return []
        return converter.structure(found, list[Attempt])

    async def wait(self, task_id: str, *, timeout: float | None = None) -> Task:
        """Return the task once it is terminal.

        :raises TaskNotFound: no such task.
        :raises WaitTimeout: still active after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            task = converter.structure(await self._request("GET", f"/v1/tasks/{task_id}"), Task)
            if task.status.terminal:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} is still {task.status.value} after {timeout} s")
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            await asyncio.sleep(max(0.0, pause))
            delay = min(0.25, delay * 1.5)

    async def progress_summary(self, filter: TaskFilter | None = None) -> ProgressSummary:
        """Counts by status of the tasks ``filter`` selects."""
        found = await self._request("GET", "/v1/summary", params=filter_params(filter))
        found.pop("pct", None)
        return converter.structure(found, ProgressSummary)

    def events(
        self, filter: TaskFilter | None = None, *, since: str | None = None
    ) -> AsyncIterator[TaskEvent]:
        """Changes to this app's tasks, live, from ``GET /v1/events``: an endless async
        iterator of ``TaskEvent`` (break out of it to stop). After a dropped connection
        it reconnects and resumes from the last event it delivered, without a gap.

        The stream opens on the first ``anext()``, and "now" is then: to see the events
        of a task you are about to create, :meth:`subscribe` first instead.

        :param since: start after this position (an ``event.cursor`` seen earlier, or
            an SSE id ``T.L``); default: from now.
        :raises InvalidCursor: on the first ``anext()``, for a position whose cursor the
            service's store did not write.
        """
        from taskmill_http.events_client import task_events

        return task_events(self._http, self.base_url, filter, since)

    def subscribe(
        self, filter: TaskFilter | None = None, *, since: str | None = None
    ) -> Subscription:
        """:meth:`events`, opened before your next step: ``async with
        client.subscribe() as events:`` returns once the service delivers every event
        from then on, so a task created inside the block is seen from its first event
        (``enqueued``). Iterate ``events`` as :meth:`events`; leaving the block closes
        the stream::

            async with client.subscribe() as events:
                task = await client.enqueue("resize", {"path": "a.png"})
                async for event in events:
                    if event.task.id == task.id and event.status.terminal:
                        break

        :param since: as for :meth:`events`.
        :raises InvalidCursor: when the block is entered, for a position whose cursor
            the service's store did not write.
        """
        from taskmill_http.events_client import Subscription

        return Subscription(self._http, self.base_url, filter, since)

    # -- managing ----------------------------------------------------------------------

    async def cancel(
        self, task_id: str, *, reason: CancelReason = CancelReason.USER, cascade: bool = True
    ) -> Task:
        """Cancel a task; its snapshot afterwards."""
        body = {"reason": reason.value, "cascade": cascade}
        return converter.structure(
            await self._request("POST", f"/v1/tasks/{task_id}/cancel", json=body), Task
        )

    async def cancel_by_filter(
        self,
        filter: TaskFilter,
        *,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> int:
        """Cancel every active task ``filter`` selects; how many changed."""
        selection = _filter_body(filter) or {"all": True}  # the service refuses {}
        body = {**selection, "reason": reason.value, "cascade": cascade}
        found = await self._request("POST", "/v1/tasks:cancel", json=body)
        return int(found["cancelled"])

    async def retry(self, task_id: str) -> Task:
        """Put a FAILED or CANCELLED task back to PENDING."""
        return converter.structure(await self._request("POST", f"/v1/tasks/{task_id}/retry"), Task)

    async def preempt(self, task_type: str, *, dedupe_key: str | None = None) -> int:
        """Cancel the active tasks of ``task_type`` as PREEMPTED; how many changed."""
        body: dict[str, Any] = {"task_type": task_type}
        if dedupe_key is not None:
            body["dedupe_key"] = dedupe_key
        found = await self._request("POST", "/v1/preempt", json=body)
        return int(found["cancelled"])

    async def suspend(self, task_type: str | None = None) -> int:
        """Suspend this app's tasks (of ``task_type``); how many running ones stopped."""
        found = await self._request("POST", "/v1/suspend", json={"task_type": task_type})
        return int(found["interrupted"])

    async def resume(self, task_type: str | None = None) -> bool:
        """Lift the suspension ``suspend(task_type)`` stored; whether there was one."""
        found = await self._request("POST", "/v1/resume", json={"task_type": task_type})
        return bool(found["resumed"])

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions of this app."""
        return converter.structure(
            await self._request("GET", "/v1/suspensions"), list[SuspensionScope]
        )

    async def cleanup(self, older_than: timedelta, *, include_failed: bool = False) -> int:
        """Delete finished tasks older than ``older_than`` (admin tokens only); how many.

        :raises PermissionDenied: the token is an app's.
        """
        body = {"older_than_seconds": older_than.total_seconds(), "include_failed": include_failed}
        found = await self._request("POST", "/v1/cleanup", json=body)
        return int(found["deleted"])
