"""The storage contract on ``sqlite:///``, plus what only a file-backed store must do."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from attrs import evolve
from taskmill.backends.sqlite import SQLiteStorage, claim_statement
from taskmill.discovery import storage_for_url
from taskmill.errors import InvalidTransition, InvalidURL, StorageUnavailable
from taskmill.model import AttemptOutcome, CancelReason, Progress, TaskFilter, TaskStatus
from taskmill.storage import ClaimRequest, FinishKind, Lease, TaskStorage, utcnow
from taskmill.testing import StorageContract, lease_of, new_task, wait_until
from taskmill.testing import claim as claim_request
from taskmill.testing import finish as finish_of


def url_of(path: Path, query: str = "") -> str:
    return f"sqlite:///{path}{query}"


class TestSQLiteStorage(StorageContract):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[TaskStorage]:
        store = SQLiteStorage.from_url(url_of(tmp_path / "tasks.db"))
        await store.open()
        yield store
        await store.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStorage]:
    s = SQLiteStorage.from_url(url_of(tmp_path / "tasks.db"))
    await s.open()
    yield s
    await s.close()


def raw(store: SQLiteStorage) -> sqlite3.Connection:
    """A second, plain connection to the store's file (autocommit)."""
    return sqlite3.connect(store.path, isolation_level=None, timeout=30)


# -- URLs and options -----------------------------------------------------------------


def test_the_entry_point_serves_sqlite_urls(tmp_path: Path):
    store = storage_for_url(url_of(tmp_path / "x.db"))
    assert isinstance(store, SQLiteStorage)
    assert not (tmp_path / "x.db").exists(), "from_url must not touch the file"


def test_relative_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    relative = SQLiteStorage.from_url("sqlite:///data/tasks.db")
    assert relative.path == str(tmp_path / "data" / "tasks.db")
    assert relative.url == "sqlite:///data/tasks.db"
    absolute = SQLiteStorage.from_url("sqlite:////var/lib/tasks.db")
    assert absolute.path == "/var/lib/tasks.db"


def test_options_from_the_query_string_and_keywords(tmp_path: Path):
    store = SQLiteStorage.from_url(url_of(tmp_path / "t.db", "?busy_timeout=10"))
    assert store.busy_timeout == 10.0
    assert store.path == str(tmp_path / "t.db")
    store = SQLiteStorage.from_url(
        url_of(tmp_path / "t.db", "?busy_timeout=10&synchronous=full"), busy_timeout=2
    )
    assert (store.busy_timeout, store.synchronous) == (2.0, "FULL")
    assert SQLiteStorage.from_url(url_of(tmp_path / "t.db")).busy_timeout == 30.0


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("sqlite://", {}, "sqlite:////absolute/path.db"),
        ("sqlite:///", {}, "sqlite:///relative/path.db"),
        ("sqlite://host/tasks.db", {}, "no host"),
        ("sqlite:///:memory:", {}, "memory://"),
        ("sqlite:///t.db?bogus=1", {}, "busy_timeout"),
        ("sqlite:///t.db", {"pool_size": 3}, "valid options are: busy_timeout"),
        ("sqlite:///t.db?busy_timeout=soon", {}, "number of seconds"),
        ("sqlite:///t.db", {"busy_timeout": -1}, "number of seconds"),
        ("sqlite:///t.db?synchronous=sometimes", {}, "NORMAL"),
    ],
)
def test_bad_urls_and_options_are_invalid(url: str, options: dict, message: str):
    with pytest.raises(InvalidURL, match=message):
        SQLiteStorage.from_url(url, **options)


async def test_the_database_runs_in_wal_mode_with_integer_timestamps(store: SQLiteStorage):
    (task,) = await store.enqueue([new_task(run_at=utcnow() + timedelta(seconds=1))])
    with raw(store) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = conn.execute(
            "SELECT typeof(created_at), typeof(run_at), run_at, params FROM tasks WHERE id = ?",
            (task.id,),
        ).fetchone()
    assert row[:2] == ("integer", "integer")
    assert row[2] == (task.run_at - task.run_at.fromtimestamp(0, task.run_at.tzinfo)) // (
        timedelta(microseconds=1)
    )
    assert json.loads(row[3]) == task.params


# -- durability and sharing -------------------------------------------------------------


async def test_tasks_survive_close_and_reopen(tmp_path: Path):
    url = url_of(tmp_path / "durable.db")
    first = SQLiteStorage.from_url(url)
    await first.open()
    tasks = await first.enqueue([new_task(params={"i": i}, dedupe_key=f"k{i}") for i in range(5)])
    claimed = await first.claim_batch(claim_request(limit=2))
    (done, _) = await first.finish_batch(
        [
            finish_of(claimed[0], result={"ok": True}, progress=Progress(1, 1, "done")),
            finish_of(claimed[1], FinishKind.RETRY, error="again", retry_in=60),
        ]
    )
    before = [await first.get(t.id) for t in tasks]
    log_before = [await first.attempts(t.id) for t in tasks]
    await first.close()

    second = SQLiteStorage.from_url(url)
    await second.open()
    try:
        assert [await second.get(t.id) for t in tasks] == before
        assert [await second.attempts(t.id) for t in tasks] == log_before
        assert done is not None and await second.get(done.id) == done
        summary = await second.summary(TaskFilter())
        assert (summary.pending, summary.completed) == (4, 1)
    finally:
        await second.close()


async def test_two_stores_on_one_file_never_claim_the_same_task(tmp_path: Path):
    url = url_of(tmp_path / "shared.db")
    a, b = SQLiteStorage.from_url(url), SQLiteStorage.from_url(url)
    await a.open()
    await b.open()
    try:
        await a.enqueue([new_task() for _ in range(400)])

        claimers = [(f"{name}{i}", store) for i in range(3) for name, store in (("a", a), ("b", b))]
        got: dict[str, list[str]] = {worker: [] for worker, _ in claimers}
        # Rounds of six simultaneous claims, three through each connection, until the
        # queue is empty: every round has both stores contending for the writer lock.
        while True:
            batches = await asyncio.gather(
                *(store.claim_batch(claim_request(worker=w, limit=7)) for w, store in claimers)
            )
            if not any(batches):
                break
            for (worker, _), batch in zip(claimers, batches, strict=True):
                assert all(t.worker_id == worker for t in batch)
                got[worker] += [t.id for t in batch]
        ids = [i for claimed in got.values() for i in claimed]
        assert len(ids) == 400
        assert len(set(ids)) == 400
        assert any(got[f"a{i}"] for i in range(3)) and any(got[f"b{i}"] for i in range(3))
        summary = await b.summary(TaskFilter())
        assert summary.running == 400
    finally:
        await a.close()
        await b.close()


_CLAIMER = """
import asyncio, json, sys
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.storage import ClaimRequest

async def main():
    store = SQLiteStorage.from_url(sys.argv[1])
    await store.open()
    request = ClaimRequest(worker_id=sys.argv[2], handlers={(None, "job"): None},
                           limit=5, lease_seconds=60)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    got = []
    while batch := await store.claim_batch(request):
        got += [t.id for t in batch]
    await store.close()
    print(json.dumps(got))

asyncio.run(main())
"""


def _run_claimers(url: str, workers: list[str]) -> list[list[str]]:
    """Start one claiming process per worker id, release them together, and return
    what each claimed."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, url, worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for worker in workers
    ]
    try:
        for proc in procs:  # every process is connected before any claims
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


@pytest.mark.slow
def test_worker_processes_never_claim_the_same_task(tmp_path: Path):
    url = url_of(tmp_path / "procs.db")

    async def setup() -> set[str]:
        store = SQLiteStorage.from_url(url)
        await store.open()
        try:
            return {t.id for t in await store.enqueue([new_task() for _ in range(600)])}
        finally:
            await store.close()

    async def owners(ids: list[str]) -> list[str | None]:
        store = SQLiteStorage.from_url(url)
        await store.open()
        try:
            return [t.worker_id if (t := await store.get(i)) else None for i in ids]
        finally:
            await store.close()

    expected = asyncio.run(setup())
    claimed = _run_claimers(url, ["p0", "p1", "p2"])
    ids = [i for got in claimed for i in got]
    assert len(ids) == len(set(ids)) == 600
    assert set(ids) == expected
    for i, got in enumerate(claimed):
        assert asyncio.run(owners(got)) == [f"p{i}"] * len(got)


# -- the claim statement ------------------------------------------------------------------


def _plan(conn: sqlite3.Connection, sql: str, params: list) -> str:
    return "\n".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


@pytest.mark.parametrize(
    "request_",
    [
        ClaimRequest(worker_id="w", handlers={(None, "job"): None}, limit=100, lease_seconds=30),
        ClaimRequest(
            worker_id="w",
            handlers={(None, "job"): 3, ("app", "job"): None, (None, "other"): None},
            limit=100,
            lease_seconds=30,
            min_priority=1000,
        ),
    ],
    ids=["one-type", "caps-apps-priority"],
)
async def test_a_claim_uses_the_partial_claim_index(store: SQLiteStorage, request_: ClaimRequest):
    await store.enqueue([new_task(t) for t in ("job", "other") for _ in range(50)])
    statement = claim_statement(request_, 0)
    assert statement is not None
    sql, params = statement
    with raw(store) as conn:
        plans = [_plan(conn, sql, params)]
        conn.execute("ANALYZE")  # with table statistics too
        plans.append(_plan(conn, sql, params))
    for plan in plans:
        assert "USING INDEX tasks_claim" in plan, plan
        assert "SCAN tasks" not in plan, plan  # never a full table scan
        assert "TEMP B-TREE" not in plan or len(request_.handlers) > 1, plan


async def test_the_lookups_by_id_lease_and_finish_time_use_indexes(store: SQLiteStorage):
    with raw(store) as conn:
        assert "sqlite_autoindex_tasks" in _plan(conn, "SELECT * FROM tasks WHERE id = ?", ["x"])
        assert "tasks_lease" in _plan(
            conn,
            "SELECT id FROM tasks WHERE status = 'running' AND lease_expires_at <= ?",
            [0],
        )
        assert "tasks_finished" in _plan(
            conn, "SELECT id FROM tasks WHERE finished_at < ? AND status IN ('completed')", [0]
        )
        assert "tasks_parent" in _plan(conn, "SELECT id FROM tasks WHERE parent_id = ?", ["p"])


# -- finishing ----------------------------------------------------------------------------


async def test_a_requested_interruption_turns_retry_and_fail_into_release(
    store: SQLiteStorage,
):
    await store.enqueue([new_task(), new_task(), new_task()])
    retrying, failing, completing = await store.claim_batch(claim_request(limit=3))
    with raw(store) as conn:
        conn.execute(
            "UPDATE tasks SET cancel_reason = 'suspended' WHERE status = 'running'",
        )
    held = await store.renew_leases([lease_of(t) for t in (retrying, failing, completing)], 30)
    assert held == dict.fromkeys((retrying.id, failing.id, completing.id), CancelReason.SUSPENDED)
    results = await store.finish_batch(
        [
            finish_of(retrying, FinishKind.RETRY, error="x", retry_in=3600),
            finish_of(failing, FinishKind.FAIL, error="y"),
            finish_of(completing, result=1),
        ]
    )
    r, f, c = results
    assert r is not None and f is not None and c is not None
    for task in (r, f):
        assert task.status is TaskStatus.PENDING
        assert task.attempts == 0
        assert task.cancel_reason is None
        assert task.run_at <= utcnow()
    assert c.status is TaskStatus.COMPLETED and c.cancel_reason is None
    for task, error in ((r, "x"), (f, "y")):
        (logged,) = await store.attempts(task.id)
        assert logged.outcome is AttemptOutcome.INTERRUPTED and logged.error == error


async def test_one_batch_mixes_every_kind_in_order(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(5)])
    c, r, f, rel, can = await store.claim_batch(claim_request(limit=5))
    results = await store.finish_batch(
        [
            finish_of(c, result=[1], data={"d": 1}),
            finish_of(r, FinishKind.RETRY, error="r", retry_in=60, progress=Progress(1, None)),
            finish_of(f, FinishKind.FAIL, error="f"),
            finish_of(rel, FinishKind.RELEASE),
            finish_of(can, FinishKind.CANCEL, cancel_reason=CancelReason.PREEMPTED, error="p"),
        ]
    )
    assert [t.id if t else None for t in results] == [c.id, r.id, f.id, rel.id, can.id]
    statuses = [t.status if t else None for t in results]
    assert statuses == [
        TaskStatus.COMPLETED,
        TaskStatus.PENDING,
        TaskStatus.FAILED,
        TaskStatus.PENDING,
        TaskStatus.CANCELLED,
    ]
    done, retried, failed, released, cancelled = results
    assert done is not None and done.result == [1] and done.data == {"d": 1}
    assert retried is not None and retried.progress == Progress()  # a requeue resets it
    assert retried.attempts == 1 and retried.error == "r"
    assert failed is not None and failed.error == "f" and failed.finished_at is not None
    assert released is not None and released.attempts == 0
    assert cancelled is not None and cancelled.cancel_reason is CancelReason.PREEMPTED
    assert cancelled.error == "p"
    for task in results:
        assert task is not None and await store.get(task.id) == task
    outcomes = [(await store.attempts(t.id))[0].outcome for t in (c, r, f, rel, can)]
    assert outcomes == [
        AttemptOutcome.COMPLETED,
        AttemptOutcome.FAILED,
        AttemptOutcome.FAILED,
        AttemptOutcome.INTERRUPTED,
        AttemptOutcome.CANCELLED,
    ]


async def test_a_task_named_twice_in_one_batch_is_finished_once(store: SQLiteStorage):
    await store.enqueue([new_task(), new_task()])
    a, b = await store.claim_batch(claim_request(limit=2))
    imposter = finish_of(b, result="imposter")
    imposter_lease = Lease(task_id=b.id, worker_id="someone-else", attempt=b.attempts)
    results = await store.finish_batch(
        [
            finish_of(a, result="first"),
            finish_of(a, result="second"),
            evolve(imposter, lease=imposter_lease),
            finish_of(b, result="real"),
        ]
    )
    assert results[1] is None and results[2] is None
    assert results[0] is not None and results[0].result == "first"
    assert results[3] is not None and results[3].result == "real"
    assert len(await store.attempts(a.id)) == 1
    assert len(await store.attempts(b.id)) == 1


async def test_large_finish_batches_are_chunked(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(300)])
    claimed = await store.claim_batch(claim_request(limit=300))
    results = await store.finish_batch([finish_of(t, result=i) for i, t in enumerate(claimed)])
    assert [t.result if t else None for t in results] == list(range(300))
    assert (await store.summary(TaskFilter())).completed == 300


# -- leases -------------------------------------------------------------------------------


async def test_rescue_honours_a_requested_interruption(store: SQLiteStorage):
    await store.enqueue([new_task(max_retries=0), new_task(max_retries=0)])
    suspended, cancelled = await store.claim_batch(claim_request(lease=0.05, limit=2))
    with raw(store) as conn:
        conn.execute("UPDATE tasks SET cancel_reason = 'suspended' WHERE id = ?", (suspended.id,))
        conn.execute("UPDATE tasks SET cancel_reason = 'user' WHERE id = ?", (cancelled.id,))
    rescued = await wait_until(store.rescue_expired)
    by_id = {t.id: t for t in rescued}
    assert by_id[suspended.id].status is TaskStatus.PENDING
    assert by_id[suspended.id].attempts == 0
    assert by_id[cancelled.id].status is TaskStatus.CANCELLED
    assert by_id[cancelled.id].finished_at is not None
    for task in (suspended, cancelled):
        (lost,) = await store.attempts(task.id)
        assert lost.outcome is AttemptOutcome.LOST


async def test_rescue_respects_its_limit(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(5)])
    await store.claim_batch(claim_request(lease=0.05, limit=5))
    first = await wait_until(lambda: store.rescue_expired(limit=2))
    assert len(first) == 2
    assert len(await store.rescue_expired(limit=10)) == 3


# -- dedupe ---------------------------------------------------------------------------------


async def test_aliases_of_a_failed_or_rescued_leader_fail_with_it(store: SQLiteStorage):
    await store.enqueue([new_task("t", dedupe_key="k", max_retries=0)])
    (alias,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (leader,) = await store.claim_batch(claim_request("t", lease=0.05))
    await wait_until(store.rescue_expired)
    current = await store.get(alias.id)
    assert current is not None and current.status is TaskStatus.FAILED
    assert current.error == "lease expired" and current.finished_at is not None
    assert current.alias_of == leader.id


async def test_redrive_respects_the_dedupe_leader(store: SQLiteStorage):
    await store.enqueue([new_task("t", dedupe_key="k", max_retries=0)])
    (alias,) = await store.enqueue([new_task("t", dedupe_key="k")])
    (old,) = await store.claim_batch(claim_request("t"))
    await store.finish_batch([finish_of(old, FinishKind.FAIL, error="x")])
    (new_leader,) = await store.enqueue([new_task("t", dedupe_key="k")])
    assert new_leader.alias_of is None
    with pytest.raises(InvalidTransition, match="already active"):
        await store.retry(old.id)
    with pytest.raises(InvalidTransition, match="alias"):
        await store.retry(alias.id)
    (running,) = await store.claim_batch(claim_request("t"))
    await store.finish_batch([finish_of(running, FinishKind.FAIL, error="y")])
    redriven = await store.retry(old.id)
    assert redriven.status is TaskStatus.PENDING and redriven.alias_of is None
    (follower,) = await store.enqueue([new_task("t", dedupe_key="k")])
    assert follower.alias_of == old.id


async def test_one_call_with_a_repeated_key_has_one_leader(store: SQLiteStorage):
    tasks = await store.enqueue([new_task("t", dedupe_key="k") for _ in range(4)])
    assert tasks[0].alias_of is None
    assert [t.alias_of for t in tasks[1:]] == [tasks[0].id] * 3
    assert [await store.get(t.id) for t in tasks] == tasks


async def test_the_host_and_an_app_named_empty_have_separate_dedupe_scopes(
    store: SQLiteStorage,
):
    host, empty = await store.enqueue(
        [new_task("t", dedupe_key="k"), new_task("t", dedupe_key="k", app_id="")]
    )
    assert host.alias_of is None and empty.alias_of is None


async def test_concurrent_enqueues_from_two_stores_yield_one_leader(tmp_path: Path):
    url = url_of(tmp_path / "dedupe.db")
    stores = [SQLiteStorage.from_url(url) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        results = await asyncio.gather(
            *(stores[i % 2].enqueue([new_task("t", dedupe_key="same")]) for i in range(30))
        )
        tasks = [t for batch in results for t in batch]
        leaders = [t for t in tasks if t.alias_of is None]
        assert len(leaders) == 1
        assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])
    finally:
        for s in stores:
            await s.close()


async def test_the_database_itself_refuses_a_second_active_leader(store: SQLiteStorage):
    (leader,) = await store.enqueue([new_task("t", app_id="a", dedupe_key="k")])
    with raw(store) as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at, app_id, "
            "params, priority, max_retries, dedupe_key) "
            "VALUES (?, 't', 'pending', 0, 0, 0, 'a', '{}', 0, 0, 'k')",
            (str(uuid.uuid4()),),
        )
    assert leader.alias_of is None


# -- reading and retention ------------------------------------------------------------------


async def test_query_pages_newest_first_and_filters_by_status_and_app(store: SQLiteStorage):
    tasks = await store.enqueue(
        [new_task("t", {"i": i}, app_id="a" if i % 2 else None) for i in range(10)]
    )
    await store.claim_batch(claim_request(("a", "t"), limit=2))
    newest = await store.query(TaskFilter(), newest_first=True, limit=3, offset=2)
    assert [t.id for t in newest] == [t.id for t in tasks[::-1][2:5]]
    running = await store.query(TaskFilter(app_id="a", statuses=(TaskStatus.RUNNING,)))
    assert [t.id for t in running] == [tasks[1].id, tasks[3].id]
    assert await store.query(TaskFilter(task_types=())) == []
    assert await store.query(TaskFilter(), limit=0) == []
    summary = await store.summary(TaskFilter(app_id="a"))
    assert (summary.total, summary.running, summary.pending) == (5, 2, 3)


async def test_next_run_at_sees_app_keys_and_ignores_aliases_and_running(
    store: SQLiteStorage,
):
    soon = utcnow() + timedelta(minutes=5)
    later = soon + timedelta(minutes=5)
    await store.enqueue([new_task("t", app_id="a", run_at=later)])
    await store.enqueue([new_task("t", app_id="b", run_at=soon, dedupe_key="k")])
    await store.enqueue(
        [new_task("t", app_id="b", run_at=soon - timedelta(minutes=1), dedupe_key="k")]
    )  # an alias: never claimed
    found = await store.next_run_at([("a", "t")])
    assert found is not None and abs((found - later).total_seconds()) < 0.001
    found = await store.next_run_at([(None, "t")])
    assert found is not None and abs((found - soon).total_seconds()) < 0.001
    assert await store.next_run_at([("c", "t"), (None, "u")]) is None


async def test_cleanup_removes_the_execution_log_rows(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(3)])
    claimed = await store.claim_batch(claim_request(limit=3))
    await store.finish_batch([finish_of(t) for t in claimed])
    # cleanup(0) takes what finished strictly before now: wait for the clock to move.
    assert await wait_until(lambda: store.cleanup(timedelta(0))) == 3
    with raw(store) as conn:
        assert conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0


async def test_a_busy_database_is_reported_as_unavailable(tmp_path: Path):
    store = SQLiteStorage.from_url(url_of(tmp_path / "busy.db"), busy_timeout=0.1)
    await store.open()
    blocker = sqlite3.connect(store.path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match="busy_timeout"):
            await store.enqueue([new_task()])
        assert time.monotonic() - started < 10
        blocker.execute("ROLLBACK")
        (task,) = await store.enqueue([new_task()])
        assert await store.get(task.id) == task
    finally:
        blocker.close()
        await store.close()


def test_no_file_is_left_open_after_close(tmp_path: Path):
    async def scenario() -> None:
        store = SQLiteStorage.from_url(url_of(tmp_path / "t.db"))
        await store.open()
        await store.enqueue([new_task()])
        await store.close()

    asyncio.run(scenario())
    if os.path.isdir("/proc/self/fd"):
        open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
        assert str(tmp_path / "t.db") not in open_files
