"""Handler options across processes (issue 28 defect 4, docs/workers.md): a process
that enqueues a task it has no handler for (the HTTP service, a web app) gives it the
``max_retries`` of the handler the live workers publish in the worker registry; the
newest live worker's wins; a task spec's own value, or a local handler's, comes first.
Two ``Taskmill`` objects on one SQLite file stand for the two processes (each its own
store object and connection)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from taskmill import Context, RetryPolicy, Taskmill, app
from taskmill.testing import wait_until

OPTIONS: dict[str, Any] = {"handle_signals": False, "rescue_interval": 0.05}


async def _registered(tm: Taskmill, count: int) -> bool:
    return len([w for w in await tm.workers() if w.alive]) >= count


async def test_a_task_created_elsewhere_gets_the_published_max_retries(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(app, "PUBLISHED_TTL", 0.0)
    url = f"sqlite:///{tmp_path / 't.db'}"
    async with Taskmill(url, plugins=False) as workers, Taskmill(url, plugins=False) as web:

        @workers.handler("resize", max_retries=1)
        async def resize(ctx: Context, params: dict[str, Any]) -> None:
            await asyncio.sleep(3600)

        # No worker yet: the default.
        assert (await web.enqueue("resize")).max_retries == 3
        worker = workers.worker(**OPTIONS)
        running = asyncio.create_task(worker.run())
        try:
            await wait_until(lambda: _registered(web, 1), timeout=20)
            assert (await web.enqueue("resize")).max_retries == 1
            # A value given with the task wins; a type no worker serves keeps the default.
            assert (await web.enqueue("resize", max_retries=7)).max_retries == 7
            assert (await web.enqueue("other")).max_retries == 3
            # An app's task of the type: the host handler serves it.
            assert (await web.for_app("photos").enqueue("resize")).max_retries == 1
        finally:
            await worker.stop(grace=0)
            await running
        # The worker removed its registration: the default again.
        assert (await web.enqueue("resize")).max_retries == 3


async def test_when_live_workers_disagree_the_newest_wins(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(app, "PUBLISHED_TTL", 0.0)
    url = f"sqlite:///{tmp_path / 't.db'}"
    async with (
        Taskmill(url, plugins=False) as old,
        Taskmill(url, plugins=False) as new,
        Taskmill(url, plugins=False) as web,
    ):
        for tm, retries in ((old, 1), (new, 5)):

            async def idle(ctx: Context, params: dict[str, Any]) -> None:
                return None

            tm.register("send", idle, max_retries=retries)
        first = old.worker(**OPTIONS)
        runs = [asyncio.create_task(first.run())]
        try:
            await wait_until(lambda: _registered(web, 1), timeout=20)
            second = new.worker(**OPTIONS)
            runs.append(asyncio.create_task(second.run()))
            await wait_until(lambda: _registered(web, 2), timeout=20)
            assert (await web.enqueue("send")).max_retries == 5
            await second.stop()
            assert (await web.enqueue("send")).max_retries == 1
        finally:
            await first.stop()
            await asyncio.gather(*runs)


async def test_a_task_created_over_http_gets_the_workers_max_retries(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The trial's case: a handler registered with max_retries=1 ran 4 attempts for
    tasks created through the service. A worker in another Taskmill (process) runs
    it; the service's own Taskmill has no handler."""
    import httpx
    from taskmill_http import create_app

    from tests.http_support import TOKENS, serve

    monkeypatch.setattr(app, "PUBLISHED_TTL", 0.0)
    url = f"sqlite:///{tmp_path / 't.db'}"
    async with Taskmill(url, plugins=False) as workers, Taskmill(url, plugins=False) as service:

        @workers.handler("flaky", max_retries=1)
        async def flaky(ctx: Context, params: dict[str, Any]) -> None:
            raise RuntimeError("down")

        @workers.handler("flaky", app_id="photos", max_retries=1)
        async def photos_flaky(ctx: Context, params: dict[str, Any]) -> None:
            raise RuntimeError("down")

        worker = workers.worker(**OPTIONS, retry_policy=RetryPolicy(base=0.01, maximum=0.01))
        running = asyncio.create_task(worker.run())
        try:
            await wait_until(lambda: _registered(service, 1), timeout=20)
            async with (
                serve(create_app(service, TOKENS)) as base,
                httpx.AsyncClient(base_url=base, timeout=10) as http,
            ):
                made = await http.post(
                    "/v1/tasks",
                    json={"task_type": "flaky"},
                    headers={"Authorization": "Bearer tok-photos"},
                )
                assert made.status_code == 201, made.text
                task_id = made.json()["id"]
                assert made.json()["max_retries"] == 1
            done = await service.wait(task_id, timeout=30)
            assert done.status.value == "failed"
            assert len(await service.attempts(task_id)) == 2  # not 4
        finally:
            await worker.stop(grace=0)
            await running
