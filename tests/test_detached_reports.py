"""The end of a detached attempt, reported over HTTP by its owner, is stored as a worker
stores the same end of a handler (``Taskmill.report_detached``): the retry budget and the
give-up note, the backoff of the workers' retry policy, dead letters, cancels and stop
requests. Real workers hand their attempts over; a real service stores the reports. On
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from taskmill import AttemptOutcome, CancelReason, Context, Detached, Taskmill, TaskStatus
from taskmill.backoff import RetryPolicy
from taskmill.errors import InvalidInput
from taskmill.model import Task
from taskmill.storage import FinishKind, utcnow
from taskmill_http import create_app
from taskmill_http.handler import lease_of, lease_token

from tests.http_support import TOKENS, serve, wait_for
from tests.test_http_proxy import running_worker
from tests.test_plugin_hooks import Recorder

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True),
]

PHOTOS = {"Authorization": "Bearer tok-photos"}
BACKOFF = RetryPolicy(base=600.0, factor=2.0, maximum=3600.0, jitter=0.0)
"""The retry policy of the workers, and so of the service: 10 min after a first attempt
(the default policy, which the service must not fall back to, waits 0.5 s)."""


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
async def http(tm: Taskmill) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(tm, TOKENS, dashboard=False, retry_policy=BACKOFF)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


@pytest.fixture
def handed_over(tm: Taskmill) -> asyncio.Queue[str]:
    """The lease tokens of the attempts of ``render`` (photos, ``max_retries=1``), each
    handed over to an owner, as an ``HttpHandler`` does on a 202."""
    leases: asyncio.Queue[str] = asyncio.Queue()

    @tm.handler("render", app_id="photos", max_retries=1)
    async def render(ctx: Context, params: dict[str, Any]) -> None:
        await leases.put(lease_token(lease_of(ctx.task)))
        raise Detached("the render farm took it over")

    return leases


async def report(http: httpx.AsyncClient, task: Task, lease: str, **body: Any) -> dict[str, Any]:
    response = await http.post(
        f"/v1/tasks/{task.id}/status", json={"lease": lease, **body}, headers=PHOTOS
    )
    assert response.status_code == 200, response.text
    stored: dict[str, Any] = response.json()
    return stored


async def test_retries_reported_past_max_retries_fail_the_task_with_the_give_up_note(
    tm: Taskmill, http: httpx.AsyncClient, handed_over: asyncio.Queue[str]
):
    recorder = Recorder()
    tm.add_plugin(recorder, name="recorder")
    async with running_worker(tm, retry_policy=BACKOFF) as worker:
        task = await tm.for_app("photos").enqueue("render")
        first = await asyncio.wait_for(handed_over.get(), 10)
        retried = await report(http, task, first, status="retry", error="out of memory", retry_in=0)
        assert retried["status"] == "pending" and retried["attempts"] == 1
        second = await asyncio.wait_for(handed_over.get(), 10)
        ended = await report(http, task, second, status="retry", error="out of memory")
        await wait_for(lambda: worker.detached == 2)
    assert ended["status"] == "failed" and ended["attempts"] == 2
    assert ended["error"] == "out of memory (gave up after 2 attempts)"
    log = await tm.attempts(task.id)
    assert [(a.number, a.outcome, a.worker_id) for a in log] == [
        (1, AttemptOutcome.FAILED, worker.worker_id),
        (2, AttemptOutcome.FAILED, worker.worker_id),
    ]
    ends = [call for call in recorder.of(task) if call[0] in ("finished", "dead_lettered")]
    assert ends[-2:] == [
        ("finished", AttemptOutcome.FAILED, TaskStatus.FAILED, ended["error"]),
        ("dead_lettered", TaskStatus.FAILED, ended["error"]),
    ]


@pytest.mark.parametrize("retry_in", [None, 42])
async def test_a_retry_report_waits_its_retry_in_else_the_backoff_of_the_workers_policy(
    tm: Taskmill, http: httpx.AsyncClient, handed_over: asyncio.Queue[str], retry_in: float | None
):
    async with running_worker(tm, retry_policy=BACKOFF):
        task = await tm.for_app("photos").enqueue("render")
        lease = await asyncio.wait_for(handed_over.get(), 10)
        before = utcnow()
        await report(http, task, lease, status="retry", retry_in=retry_in)
        after = utcnow()
    stored = await tm.get(task.id)
    assert stored is not None and stored.status is TaskStatus.PENDING
    assert stored.error == "the owner asked for a retry"
    delay = timedelta(seconds=BACKOFF.delay(1) if retry_in is None else retry_in)
    assert before + delay <= stored.run_at <= after + delay


async def test_a_failed_report_is_a_dead_letter_even_with_retries_left(
    tm: Taskmill, http: httpx.AsyncClient, handed_over: asyncio.Queue[str]
):
    async with running_worker(tm, retry_policy=BACKOFF):
        task = await tm.for_app("photos").enqueue("render")
        lease = await asyncio.wait_for(handed_over.get(), 10)
        ended = await report(http, task, lease, status="failed", error="bad input file")
    assert ended["status"] == "failed" and ended["attempts"] == 1
    assert ended["error"] == "bad input file"


async def test_a_cancelled_report_cancels_the_task_as_its_user_would(
    tm: Taskmill, http: httpx.AsyncClient, handed_over: asyncio.Queue[str]
):
    async with running_worker(tm, retry_policy=BACKOFF):
        task = await tm.for_app("photos").enqueue("render")
        lease = await asyncio.wait_for(handed_over.get(), 10)
        ended = await report(http, task, lease, status="cancelled")
    assert ended["status"] == "cancelled" and ended["cancel_reason"] == "user"
    assert ended["error"] == "cancelled (user)"
    (attempt,) = await tm.attempts(task.id)
    assert attempt.outcome is AttemptOutcome.CANCELLED


async def test_an_end_reported_after_a_suspension_gives_the_attempt_back(
    tm: Taskmill, http: httpx.AsyncClient, handed_over: asyncio.Queue[str]
):
    photos = tm.for_app("photos")
    async with running_worker(tm, retry_policy=BACKOFF):
        task = await photos.enqueue("render")
        lease = await asyncio.wait_for(handed_over.get(), 10)
        await photos.suspend("render")
        # The budget is not what decides here: a stop request wins over a retry.
        back = await report(http, task, lease, status="retry")
    assert back["status"] == "pending" and back["attempts"] == 0
    (attempt,) = await tm.attempts(task.id)
    assert attempt.outcome is AttemptOutcome.INTERRUPTED


async def test_a_report_refuses_a_reason_that_does_not_fit_its_end(
    tm: Taskmill, handed_over: asyncio.Queue[str]
):
    async with running_worker(tm, retry_policy=BACKOFF):
        task = await tm.for_app("photos").enqueue("render")
        token = await asyncio.wait_for(handed_over.get(), 10)
    running = await tm.get(task.id)
    assert running is not None and lease_token(lease_of(running)) == token
    lease = lease_of(running)
    with pytest.raises(InvalidInput, match="SUSPENDED or SHUTDOWN"):
        await tm.report_detached(lease, FinishKind.RELEASE, reason=CancelReason.USER)
    with pytest.raises(InvalidInput, match="retry_in"):
        await tm.report_detached(lease, FinishKind.RETRY, retry_in=-1)
    assert (await tm.get(task.id)) == running  # nothing written
