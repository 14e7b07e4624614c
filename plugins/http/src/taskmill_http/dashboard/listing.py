"""The dashboard's task list: its filters, as a URL's query string, and keyset pages.

Pages run newest first. A page's cursor is the position after its last row: that row's
creation time and how many rows created at that same instant were already shown, so
the next page is "created at or before that instant, skipping those ties". A page costs
no OFFSET into the whole list, and tasks enqueued meanwhile do not shift the pages a
reader is walking (they show on the first page).

The store orders by its insertion sequence, the cursor is a creation time: where the two
disagree (PostgreSQL stamps a task with its transaction's start, so concurrent enqueues
can invert them) a task at a page boundary can show twice or not at all. See
docs/dashboard.md.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import attrs
from starlette.requests import Request
from taskmill.model import Task, TaskFilter, TaskStatus
from taskmill.operations import TaskOperations

from taskmill_http import requests as rq
from taskmill_http.errors import ServiceError
from taskmill_http.tokens import Caller

PAGE_SIZE = 50
"""Rows on one page of the task list."""

_CURSOR = re.compile(r"^(\d{1,18})\.(\d{1,9})$")
_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@attrs.frozen
class Cursor:
    """Where the next page starts: after ``ties`` rows created at ``created_at``."""

    created_at: datetime
    ties: int

    def __str__(self) -> str:
        micros = (self.created_at - _EPOCH) // _MICROSECOND
        return f"{micros}.{self.ties}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """:raises ServiceError: 422 for anything but a cursor this module wrote."""
        match = _CURSOR.match(text)
        if match is None:
            raise ServiceError(422, "invalid_query", "cursor is not one the dashboard wrote")
        created_at = _EPOCH + timedelta(microseconds=int(match.group(1)))
        return cls(created_at, int(match.group(2)))


def _field(request: Request, name: str) -> str | None:
    """A field of the filter form: None when left empty (a form sends every field).

    :raises ServiceError: 422 for a value too long or holding a NUL.
    """
    value = request.query_params.get(name, "").strip() or None
    rq.check_identifier(name, value)
    return value


@attrs.frozen
class ListQuery:
    """What the task list shows: its filters and where the page starts."""

    app_id: str | None = None
    task_type: str | None = None
    statuses: tuple[TaskStatus, ...] = ()
    text: str | None = None
    """An exact task id or dedupe key."""
    parent_id: str | None = None
    cursor: Cursor | None = None

    @classmethod
    def from_request(cls, request: Request, caller: Caller) -> ListQuery:
        """The list's query string, checked against the caller's app.

        :raises ServiceError: 403 when an app token names another app, 422 for a value
            the list cannot take.
        """
        app_id = _field(request, "app_id")
        rq.ensure_own_app(caller.app_id, app_id)
        cursor = _field(request, "cursor")
        return cls(
            app_id=app_id,
            task_type=_field(request, "task_type"),
            statuses=rq.query_statuses(request) or (),
            text=_field(request, "q"),
            parent_id=_field(request, "parent_id"),
            cursor=None if not cursor else Cursor.parse(cursor),
        )

    def task_filter(self, *, dedupe_key: str | None = None) -> TaskFilter:
        """The filter of this list, without its position."""
        return TaskFilter(
            app_id=self.app_id,
            task_types=None if self.task_type is None else (self.task_type,),
            statuses=self.statuses or None,
            parent_id=self.parent_id,
            dedupe_key=dedupe_key,
            created_before=None if self.cursor is None else self.cursor.created_at + _MICROSECOND,
        )

    def event_filter(self) -> TaskFilter:
        """What the live updates of this list need: its app and type, every status
        (a row whose task leaves a filtered status still changes on the page)."""
        return TaskFilter(
            app_id=self.app_id,
            task_types=None if self.task_type is None else (self.task_type,),
        )

    def query_string(self, *, cursor: Cursor | None = None) -> str:
        """This list's filters (at ``cursor``) as a query string, for links."""
        pairs: list[tuple[str, str]] = []
        if self.app_id is not None:
            pairs.append(("app_id", self.app_id))
        if self.task_type is not None:
            pairs.append(("task_type", self.task_type))
        pairs.extend(("status", s.value) for s in self.statuses)
        if self.text is not None:
            pairs.append(("q", self.text))
        if self.parent_id is not None:
            pairs.append(("parent_id", self.parent_id))
        if cursor is not None:
            pairs.append(("cursor", str(cursor)))
        return urlencode(pairs)

    @property
    def filtered(self) -> bool:
        """True when any filter is set."""
        return bool(self.app_id or self.task_type or self.statuses or self.text or self.parent_id)


@attrs.frozen
class TaskPage:
    """One page of the list and where the next one starts (None on the last)."""

    tasks: list[Task]
    next_cursor: Cursor | None


async def list_page(ops: TaskOperations, query: ListQuery, size: int = PAGE_SIZE) -> TaskPage:
    """The page ``query`` asks for, read through ``ops`` (so scoped to its app).

    The text matches an exact task id first (that task alone, when the other filters
    select it), else an exact dedupe key.
    """
    if query.text is not None and query.cursor is None:
        found = await ops.get(query.text)
        if found is not None and query.task_filter().matches(found):
            return TaskPage([found], None)
    offset = 0 if query.cursor is None else query.cursor.ties
    rows = await ops.query(
        query.task_filter(dedupe_key=query.text), limit=size + 1, offset=offset, newest_first=True
    )
    page = rows[:size]
    if len(rows) <= size:
        return TaskPage(page, None)
    last = page[-1].created_at
    ties = sum(1 for task in page if task.created_at == last)
    if query.cursor is not None and query.cursor.created_at == last:
        ties += query.cursor.ties
    return TaskPage(page, Cursor(last, ties))
