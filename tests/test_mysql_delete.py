"""Delete on finish on ``mysql://``, beyond the shared RetentionContract: a deleting
finish writes its tombstone in place of its ``UPDATE`` (the values the ``UPDATE``
would write, checked with awkward ones), the keep-mode finish sends what it sent
before, a task named twice in one batch is buried once, and an id reused after a
delete replaces its tombstone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from taskmill.model import EventKind, Progress, TaskFilter, TaskStatus
from taskmill.storage import FinishKind
from taskmill.testing import finish, new_task
from taskmill.testing.helpers import claim
from taskmill_mysql import MySQLStorage
from taskmill_mysql.connection import Session

_AWKWARD = "quote\" back\\ tab\t nl\n é 😀 \u2028 '; DROP"


@pytest.fixture
async def store(mysql_url: str) -> AsyncIterator[MySQLStorage]:
    storage = MySQLStorage.from_url(mysql_url)
    await storage.open()
    yield storage
    await storage.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store sends from now on."""
    statements: list[str] = []
    real = Session._packet

    async def recorded(self: Session, texts: list[str], size: int) -> int:
        statements.extend(texts)
        return await real(self, texts, size)

    monkeypatch.setattr(Session, "_packet", recorded)
    return statements


def _head(statement: str) -> str:
    return " ".join(statement.split()[:3])


@pytest.mark.parametrize("kind", [FinishKind.COMPLETE, FinishKind.FAIL])
@pytest.mark.parametrize("snapshots", [True, False])
async def test_a_tombstone_holds_what_the_finish_would_have_stored(
    store: MySQLStorage, kind: FinishKind, snapshots: bool
) -> None:
    """The tombstone is written from the finish's values and the locked row, not from
    an updated row: it equals the snapshot the finish returns (the kernel's transition,
    which equals the stored row in keep mode) and a keep-mode twin's stored row."""
    params: dict[str, Any] = {"s": _AWKWARD, "f": 0.1 + 0.2}
    kept, gone = await store.enqueue([new_task(params=params) for _ in range(2)])
    running = {t.id: t for t in await store.claim_batch(claim())}
    values: dict[str, Any] = {
        "data": {"d": _AWKWARD},
        "progress": Progress(1 / 3, 7.25, _AWKWARD),
    }
    if kind is FinishKind.COMPLETE:
        values["result"] = [_AWKWARD, 1.5]
    else:
        values["error"] = _AWKWARD
    finishes = [
        finish(running[kept.id], kind, **values),
        finish(running[gone.id], kind, delete=True, **values),
    ]
    if snapshots:
        stored_kept, returned = await store.finish_batch(finishes)
    else:
        assert await store.finish_batch_applied(finishes) == [True, True]
        stored_kept = returned = None
    assert await store.get(gone.id) is None
    tombstone = await store.deleted_task(gone.id)
    assert tombstone is not None
    if returned is not None:
        assert tombstone == returned
    twin = await store.get(kept.id)
    assert twin is not None and (stored_kept is None or twin == stored_kept)
    same = ("id", "params", "created_at", "run_at", "started_at", "finished_at", "updated_at")
    assert attrs.evolve(tombstone, **{f: getattr(twin, f) for f in same}) == twin
    assert tombstone.status is (
        TaskStatus.COMPLETED if kind is FinishKind.COMPLETE else TaskStatus.FAILED
    )
    assert tombstone.finished_at == tombstone.updated_at and tombstone.worker_id is None


async def test_the_keep_mode_finish_sends_what_it_sent_before(
    store: MySQLStorage, sent: list[str]
) -> None:
    """No statement of a finish without ``delete`` names the tombstones, and a deleting
    finish updates no task row before deleting it."""
    tasks = await store.enqueue([new_task() for _ in range(4)])
    running = await store.claim_batch(claim())
    sent.clear()
    await store.finish_batch_applied([finish(t, result=1) for t in running[:2]])
    assert [_head(text) for text in sent] == [
        "START TRANSACTION",
        "SELECT JSON_ARRAY(seq, id,",
        "UPDATE tasks AS",
        "SELECT depends_on, task_id,",
        "INSERT INTO attempts",
        "UPDATE event_cursor SET",
        "INSERT INTO events",
        "COMMIT",
    ]
    sent.clear()
    await store.finish_batch_applied([finish(t, result=1, delete=True) for t in running[2:]])
    assert [_head(text) for text in sent] == [
        "START TRANSACTION",
        "SELECT JSON_ARRAY(seq, id,",
        "REPLACE INTO tombstones",
        "SELECT depends_on, task_id,",
        "DELETE FROM attempts",
        "DELETE FROM tasks",
        "UPDATE event_cursor SET",
        "INSERT INTO events",
        "COMMIT",
    ]
    assert [t.id for t in await store.query(TaskFilter(), limit=10)] == [t.id for t in tasks[:2]]


async def test_a_task_named_twice_in_one_batch_is_buried_once(store: MySQLStorage) -> None:
    """The buried row stays RUNNING until the settlement deletes it: the second finish
    of the same lease in the batch finds its lease gone, as in keep mode."""
    (task,) = await store.enqueue([new_task()])
    (running,) = await store.claim_batch(claim())
    _, start = await store.read_events(None)
    first, second = await store.finish_batch(
        [finish(running, result=1, delete=True), finish(running, result=2, delete=True)]
    )
    assert first is not None and first.result == 1 and second is None
    gone = await store.deleted_task(task.id)
    assert gone is not None and gone.result == 1
    events, _ = await store.read_events(start)
    assert [e.kind for e in events] == [EventKind.COMPLETED]


async def test_an_id_enqueued_again_after_its_delete_replaces_its_tombstone(
    store: MySQLStorage,
) -> None:
    (task,) = await store.enqueue([new_task()])
    (running,) = await store.claim_batch(claim())
    await store.finish_batch_applied([finish(running, result="first", delete=True)])
    (again,) = await store.enqueue([attrs.evolve(new_task(), id=task.id)])
    assert again.id == task.id and again.status is TaskStatus.PENDING
    gone = await store.deleted_task(task.id)
    assert gone is not None and gone.result == "first"
    (running,) = await store.claim_batch(claim())
    await store.finish_batch_applied([finish(running, result="second", delete=True)])
    gone = await store.deleted_task(task.id)
    assert gone is not None and gone.result == "second"
    assert await store.get(task.id) is None


async def test_aliases_settled_by_a_buried_leader_take_its_result_without_snapshots(
    store: MySQLStorage,
) -> None:
    """``finish_batch_applied`` (what a worker calls) reads the leader's values for its
    aliases from its tombstone: its row was never updated."""
    (leader,) = await store.enqueue([new_task(dedupe_key="k")])
    (alias,) = await store.enqueue([new_task(dedupe_key="k")])
    (running,) = await store.claim_batch(claim())
    await store.finish_batch_applied([finish(running, result={"ok": _AWKWARD}, delete=True)])
    for one in (leader, alias):
        assert await store.get(one.id) is None
        gone = await store.deleted_task(one.id)
        assert gone is not None and (gone.status, gone.result) == (
            TaskStatus.COMPLETED,
            {"ok": _AWKWARD},
        )
