"""The HTTP proxy handler against real receivers (tests/http_sidecar.py, a separate
process): handlers registered through the service are served by a worker of another
``Taskmill`` that found taskmill-http through its entry point; 200 / 4xx / 5xx / 202
rules, timeouts, a receiver that dies, cancels, and the lease-fenced reports of
detached owners. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import taskmill_http.plugin
from taskmill import AttemptOutcome, Taskmill, TaskStatus
from taskmill.storage import ClaimRequest
from taskmill_http import Client, HttpHandler, create_app, stored_handlers
from taskmill_http.handler import lease_of, lease_token

from tests.http_support import TOKENS, loopback_socket, serve, wait_for
from tests.test_plugin_hooks import Recorder

pytestmark = pytest.mark.timeout(90)

SIDECAR = Path(__file__).with_name("http_sidecar.py")
PHOTOS = {"Authorization": "Bearer tok-photos"}
MUSIC = {"Authorization": "Bearer tok-music"}


@pytest.fixture
async def service_tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as tm:
        yield tm


@pytest.fixture
async def base_url(service_tm: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(service_tm, TOKENS)) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        yield client


class Sidecar:
    """The receiver process, restartable on its port."""

    def __init__(self, base_url: str, log: Path) -> None:
        self.base_url = base_url
        self.log = log
        sock = loopback_socket()
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}/run"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(SIDECAR),
                str(self.port),
                self.base_url,
                "tok-photos",
                str(self.log),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)
            assert self.process.stdout is not None
            self.process.stdout.close()

    def events(self, name: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


@pytest.fixture
def sidecar(base_url: str, tmp_path: Path) -> Iterator[Sidecar]:
    receiver = Sidecar(base_url, tmp_path / "sidecar.jsonl")
    receiver.start()
    yield receiver
    receiver.stop()


@pytest.fixture
async def worker_tm(store_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Taskmill]:
    """A second Taskmill on the same store: the worker's process, as it would be."""
    monkeypatch.setattr(taskmill_http.plugin.plugin, "refresh_interval", 0.1)
    tm = Taskmill(store_url)
    tm.load_plugins(enable=["http"])  # found through its installed entry point
    assert tm.plugins.get("http") is not None
    async with tm:
        yield tm


@contextlib.asynccontextmanager
async def running_worker(tm: Taskmill, **options: Any) -> AsyncIterator[Any]:
    worker = tm.worker(
        concurrency=4,
        reserved_high_priority_slots=0,
        handle_signals=False,
        poll_interval=0.05,
        cancel_check_interval=0.05,
        **options,
    )
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop(grace=0)
        await running


async def register(http: httpx.AsyncClient, task_type: str, url: str, **options: Any) -> None:
    response = await http.put(
        f"/v1/handlers/{task_type}", json={"url": url, **options}, headers=PHOTOS
    )
    assert response.status_code == 200, response.text


async def wait_registered(tm: Taskmill, task_type: str) -> None:
    await wait_for(lambda: tm.registry.lookup("photos", task_type) is not None)


# -- registrations ---------------------------------------------------------------------------


async def test_registrations_are_stored_scoped_and_served_by_workers_elsewhere(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "echo", sidecar.url, max_retries=5, timeout=30)
    listed = (await http.get("/v1/handlers", headers=PHOTOS)).json()
    assert [(h["app_id"], h["task_type"], h["url"]) for h in listed] == [
        ("photos", "echo", sidecar.url)
    ]
    assert (await http.get("/v1/handlers", headers=MUSIC)).json() == []
    refused = await http.put(
        "/v1/handlers/echo", json={"url": "ftp://x", "app_id": "music"}, headers=PHOTOS
    )
    assert refused.status_code == 422
    async with running_worker(worker_tm), Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "echo")
        task = await client.enqueue("echo", {"behavior": "ok", "value": 7})
        assert task.max_retries == 5  # the registration's option, applied at enqueue
        done = await client.wait(task.id, timeout=20)
        assert done.status is TaskStatus.COMPLETED and done.result == {"echo": 7, "attempt": 1}
        (received,) = sidecar.events("received")
        assert received["app_id"] == "photos" and received["attempt"] == 1
        gone = await http.delete("/v1/handlers/echo", headers=PHOTOS)
        assert gone.json() == {"deleted": True}
        assert (await http.delete("/v1/handlers/echo", headers=PHOTOS)).status_code == 404
        await wait_for(lambda: worker_tm.registry.lookup("photos", "echo") is None)


async def test_registrations_survive_a_restart_of_the_service(store_url: str, sidecar: Sidecar):
    async with (
        Taskmill(store_url, plugins=False) as tm,
        serve(create_app(tm, TOKENS)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        await register(http, "echo", sidecar.url)
    async with (
        Taskmill(store_url, plugins=False) as tm,
        serve(create_app(tm, TOKENS)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        if True:
            listed = (await http.get("/v1/handlers", headers=PHOTOS)).json()
            assert [h["url"] for h in listed] == [sidecar.url]
            assert tm.registry.lookup("photos", "echo") is not None


# -- attached receivers -------------------------------------------------------------------------


async def test_4xx_fails_at_once_and_5xx_is_retried(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "work", sidecar.url, max_retries=3)
    async with running_worker(worker_tm), Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "work")
        rejected = await client.enqueue("work", {"behavior": "reject"})
        flaky = await client.enqueue("work", {"behavior": "flaky", "succeed_on": 2})
        rejected = await client.wait(rejected.id, timeout=20)
        flaky = await client.wait(flaky.id, timeout=20)
    assert rejected.status is TaskStatus.FAILED and rejected.attempts == 1
    assert "422" in (rejected.error or "") and "cannot be processed" in (rejected.error or "")
    assert flaky.status is TaskStatus.COMPLETED and flaky.attempts == 2
    assert [a.outcome for a in await worker_tm.attempts(flaky.id)] == [
        AttemptOutcome.FAILED,
        AttemptOutcome.COMPLETED,
    ]


async def test_a_hanging_receiver_times_out_and_its_request_is_aborted(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "slow", sidecar.url, timeout=0.5, max_retries=0)
    async with running_worker(worker_tm), Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "slow")
        task = await client.enqueue("slow", {"behavior": "hang"})
        done = await client.wait(task.id, timeout=20)
    assert done.status is TaskStatus.FAILED and "timed out" in (done.error or "")
    assert [a.outcome for a in await worker_tm.attempts(task.id)] == [AttemptOutcome.TIMED_OUT]
    await wait_for(lambda: len(sidecar.events("aborted")) == 1)


async def test_a_cancel_aborts_the_attached_request(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "slow", sidecar.url)
    async with running_worker(worker_tm), Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "slow")
        task = await client.enqueue("slow", {"behavior": "hang"})
        await wait_for(lambda: len(sidecar.events("received")) == 1)
        cancelled = await client.cancel(task.id)
        assert cancelled.status is TaskStatus.CANCELLED
        await wait_for(lambda: len(sidecar.events("aborted")) == 1)
        await wait_for(lambda: worker_tm.registry is not None and _idle(worker_tm))
    assert (await worker_tm.get(task.id)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


def _idle(tm: Taskmill) -> bool:
    return all(w.running == 0 for w in tm._workers)


async def test_a_receiver_that_dies_mid_task_is_retried_once_it_is_back(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "fragile", sidecar.url, max_retries=10)
    async with running_worker(worker_tm), Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "fragile")
        task = await client.enqueue("fragile", {"behavior": "die_once"})
        await wait_for(lambda: sidecar.process is not None and sidecar.process.poll() is not None)
        sidecar.stop()
        sidecar.start()  # back on the same port
        done = await client.wait(task.id, timeout=30)
    assert done.status is TaskStatus.COMPLETED and done.result["survived"] is True
    attempts = await worker_tm.attempts(task.id)
    assert [a.outcome for a in attempts[:-1]] == [AttemptOutcome.FAILED] * (len(attempts) - 1)
    assert "cannot reach" in (attempts[0].error or "")
    assert attempts[-1].outcome is AttemptOutcome.COMPLETED


# -- detached receivers (202) ---------------------------------------------------------------------


async def test_a_detached_receiver_reports_progress_and_status_and_frees_the_slot(
    http: httpx.AsyncClient,
    base_url: str,
    sidecar: Sidecar,
    worker_tm: Taskmill,
    service_tm: Taskmill,
):
    in_worker, in_service = Recorder(), Recorder()
    worker_tm.add_plugin(in_worker, name="recorder")
    service_tm.add_plugin(in_service, name="recorder")
    await register(http, "long", sidecar.url, max_retries=0)
    async with running_worker(worker_tm) as worker, Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "long")
        task = await client.enqueue("long", {"behavior": "detach"})
        await wait_for(lambda: len(sidecar.events("received")) == 1)
        await wait_for(lambda: worker.running == 0 and worker.held == 0)
        done = await client.wait(task.id, timeout=20)
    assert done.status is TaskStatus.COMPLETED and done.result == {"detached": True}
    assert done.progress.done == 2 and done.progress.total == 2
    assert sidecar.events("reported")[0]["status"] == 200
    (attempt,) = await worker_tm.attempts(task.id)
    assert attempt.outcome is AttemptOutcome.COMPLETED and attempt.worker_id == worker.worker_id
    assert worker.detached == 1 and worker.processed == 0
    # The worker that handed the attempt over says so; the process that stored the
    # owner's report (the service) says how it ended.
    assert in_worker.of(task) == [("started", 1), ("detached", 1)]
    assert in_service.of(task) == [
        ("enqueued", TaskStatus.PENDING),
        ("finished", AttemptOutcome.COMPLETED, TaskStatus.COMPLETED, None),
    ]


async def test_a_cancel_reaches_a_detached_owner_as_409(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "long", sidecar.url)
    async with running_worker(worker_tm) as worker, Client(base_url, "tok-photos") as client:
        await wait_registered(worker_tm, "long")
        task = await client.enqueue("long", {"behavior": "detach_until_cancelled"})
        await wait_for(lambda: worker.held == 0 and len(sidecar.events("received")) == 1)
        await client.cancel(task.id)
        await wait_for(lambda: len(sidecar.events("refused")) == 1)
    assert sidecar.events("refused")[0]["code"] == "cancelled"
    # One attempt, handed over and ended by the cancel; the worker wrote nothing for it.
    assert len(sidecar.events("received")) == 1
    assert [a.outcome for a in await worker_tm.attempts(task.id)] == [AttemptOutcome.CANCELLED]


async def test_a_detached_owner_that_dies_loses_the_lease_and_the_task_is_rescued(
    http: httpx.AsyncClient, base_url: str, sidecar: Sidecar, worker_tm: Taskmill
):
    await register(http, "long", sidecar.url, max_retries=3)
    async with (
        running_worker(worker_tm, lease_seconds=1.0),
        Client(base_url, "tok-photos") as client,
    ):
        await wait_registered(worker_tm, "long")
        task = await client.enqueue("long", {"behavior": "detach_and_die"})
        await wait_for(lambda: sidecar.process is not None and sidecar.process.poll() is not None)
        sidecar.stop()
        sidecar.start()
        await wait_for(lambda: len(sidecar.events("received")) >= 2, timeout=20)
    outcomes = [a.outcome for a in await worker_tm.attempts(task.id)]
    assert outcomes[0] is AttemptOutcome.LOST


# -- the reports, fenced by the lease ---------------------------------------------------------


async def test_reports_are_fenced_by_the_lease_and_scoped_to_the_app(
    http: httpx.AsyncClient, service_tm: Taskmill
):
    """A receiver holding the lease of a claimed attempt (what a worker hands over on
    202) reports; a stale or foreign report changes nothing."""
    photos = service_tm.for_app("photos")
    first = await photos.enqueue("long", max_retries=2)
    second = await photos.enqueue("long")
    (claimed, other) = await service_tm.storage.claim_batch(
        ClaimRequest(worker_id="w1", handlers={("photos", "long"): None}, limit=2, lease_seconds=5)
    )
    assert {claimed.id, other.id} == {first.id, second.id}
    lease = lease_token(lease_of(claimed))
    stale = f"{claimed.attempts + 1}:w1"
    url = f"/v1/tasks/{claimed.id}"

    foreign = await http.post(f"{url}/progress", json={"lease": lease, "done": 1}, headers=MUSIC)
    assert foreign.status_code == 404
    malformed = await http.post(f"{url}/progress", json={"lease": "x"}, headers=PHOTOS)
    assert malformed.status_code == 422
    lost = await http.post(f"{url}/progress", json={"lease": stale, "done": 1}, headers=PHOTOS)
    assert lost.status_code == 409 and lost.json()["error"]["code"] == "lease_lost"

    step = await http.post(
        f"{url}/progress",
        json={"lease": lease, "done": 1, "total": 4, "message": "a", "data": {"k": 1}},
        headers=PHOTOS,
    )
    assert step.status_code == 200, step.text
    task = step.json()
    assert task["progress"] == {"done": 1.0, "total": 4.0, "message": "a"}
    assert task["data"] == {"k": 1}
    assert task["lease_expires_at"] > claimed.lease_expires_at.isoformat()  # type: ignore[union-attr]

    retry = await http.post(
        f"{url}/status", json={"lease": lease, "status": "retry", "retry_in": 0}, headers=PHOTOS
    )
    assert retry.status_code == 200 and retry.json()["status"] == "pending"
    again = await http.post(
        f"{url}/status", json={"lease": lease, "status": "completed"}, headers=PHOTOS
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "lease_lost"

    other_lease = lease_token(lease_of(other))
    await service_tm.cancel(other.id)
    cancelled = await http.post(
        f"/v1/tasks/{other.id}/progress", json={"lease": other_lease, "done": 1}, headers=PHOTOS
    )
    assert cancelled.status_code == 409 and cancelled.json()["error"]["code"] == "cancelled"

    (reclaimed,) = await service_tm.storage.claim_batch(
        ClaimRequest(worker_id="w2", handlers={("photos", "long"): None}, limit=1, lease_seconds=60)
    )
    done = await http.post(
        f"/v1/tasks/{reclaimed.id}/status",
        json={"lease": lease_token(lease_of(reclaimed)), "status": "completed", "result": [1]},
        headers=PHOTOS,
    )
    assert done.status_code == 200 and done.json()["status"] == "completed"
    assert done.json()["result"] == [1]
    log = await service_tm.attempts(claimed.id)
    assert [(a.worker_id, a.outcome) for a in log] == [
        ("w1", AttemptOutcome.FAILED),
        ("w2", AttemptOutcome.COMPLETED),
    ]


async def test_a_suspension_reaches_a_detached_owner_and_gives_the_task_back(
    http: httpx.AsyncClient, service_tm: Taskmill
):
    recorder = Recorder()
    service_tm.add_plugin(recorder, name="recorder")
    photos = service_tm.for_app("photos")
    task = await photos.enqueue("long")
    (claimed,) = await service_tm.storage.claim_batch(
        ClaimRequest(worker_id="w1", handlers={("photos", "long"): None}, limit=1, lease_seconds=60)
    )
    await photos.suspend("long")
    refused = await http.post(
        f"/v1/tasks/{task.id}/progress",
        json={"lease": lease_token(lease_of(claimed)), "done": 1},
        headers=PHOTOS,
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "cancelled"
    back = await service_tm.get(task.id)
    assert back is not None and back.status is TaskStatus.PENDING and back.attempts == 0
    assert recorder.of(task)[1:] == [
        ("finished", AttemptOutcome.INTERRUPTED, TaskStatus.PENDING, "cancelled (suspended)"),
    ]


def test_an_http_handler_needs_an_http_url():
    with pytest.raises(ValueError, match="http"):
        HttpHandler("ftp://example.com")
    assert stored_handlers is not None
