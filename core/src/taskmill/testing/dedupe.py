"""Contract: dedupe (SPEC 5.7): leaders, aliases, their settlement, and redrives that
would break them."""

from __future__ import annotations

import pytest

from taskmill.errors import InvalidTransition
from taskmill.model import TaskStatus
from taskmill.storage import FinishKind, TaskStorage
from taskmill.testing.helpers import claim, finish, new_task, wait_until

__all__ = ["DedupeContract"]


class DedupeContract:
    """One active leader per ``(app_id, task_type, dedupe_key)``; aliases follow it."""

    async def test_dedupe_key_with_an_active_leader_makes_an_alias(
        self, storage: TaskStorage
    ) -> None:
        (leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert leader.alias_of is None
        assert alias.alias_of == leader.id
        assert alias.status is TaskStatus.PENDING
        claimed = await storage.claim_batch(claim("t"))
        assert [t.id for t in claimed] == [leader.id]

    async def test_dedupe_is_scoped_by_app_and_type(self, storage: TaskStorage) -> None:
        tasks = await storage.enqueue(
            [
                new_task("t", dedupe_key="k"),
                new_task("u", dedupe_key="k"),
                new_task("t", dedupe_key="k", app_id="a"),
            ]
        )
        assert all(t.alias_of is None for t in tasks)

    async def test_keys_types_and_apps_that_differ_in_any_byte_are_separate(
        self, storage: TaskStorage
    ) -> None:
        """Dedupe keys, task types and app ids are compared byte for byte, whatever a
        locale would make of them: case, a composed and a decomposed accent, "ß" and
        "SS" (PostgreSQL's schema 6 and MySQL's binary collation keep them apart)."""
        composed, decomposed = "caf\u00e9", "cafe\u0301"
        tasks = await storage.enqueue(
            [
                new_task(composed, app_id=composed, dedupe_key="Stra\u00dfe"),
                new_task(composed, app_id=composed, dedupe_key="STRASSE"),
                new_task(composed, app_id=composed, dedupe_key="strasse"),
                new_task(decomposed, app_id=decomposed, dedupe_key="Stra\u00dfe"),
                new_task(composed, app_id=decomposed, dedupe_key="Stra\u00dfe"),
            ]
        )
        assert [t.alias_of for t in tasks] == [None] * 5  # five scopes, five leaders
        claimed = await storage.claim_batch(claim((composed, composed), limit=10))
        assert sorted(t.id for t in claimed) == sorted(t.id for t in tasks[:3])
        (other,) = await storage.claim_batch(claim((decomposed, decomposed), limit=10))
        assert other.id == tasks[3].id

    async def test_aliases_take_the_leaders_outcome(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("t", dedupe_key="k")])
        aliases = await storage.enqueue([new_task("t", dedupe_key="k") for _ in range(3)])
        (running,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(running, result={"v": 1})])
        for alias in aliases:
            current = await storage.get(alias.id)
            assert current is not None
            assert current.status is TaskStatus.COMPLETED
            assert current.result == {"v": 1}

    async def test_a_terminal_leader_frees_its_dedupe_key(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("t", dedupe_key="k")])
        (running,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="x")])
        (second,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert second.alias_of is None

    async def test_one_call_with_a_repeated_key_has_one_leader(self, storage: TaskStorage) -> None:
        tasks = await storage.enqueue([new_task("t", dedupe_key="k") for _ in range(4)])
        assert tasks[0].alias_of is None
        assert [t.alias_of for t in tasks[1:]] == [tasks[0].id] * 3
        assert [await storage.get(t.id) for t in tasks] == tasks

    async def test_the_host_and_an_app_named_empty_have_separate_dedupe_scopes(
        self, storage: TaskStorage
    ) -> None:
        host, empty = await storage.enqueue(
            [new_task("t", dedupe_key="k"), new_task("t", dedupe_key="k", app_id="")]
        )
        assert host.alias_of is None and empty.alias_of is None
        (again,) = await storage.enqueue([new_task("t", dedupe_key="k", app_id="")])
        assert again.alias_of == empty.id

    async def test_aliases_of_a_rescued_leader_fail_with_it(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task("t", dedupe_key="k", max_retries=0)])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (leader,) = await storage.claim_batch(claim("t", lease=0.05))
        await wait_until(storage.rescue_expired)
        current = await storage.get(alias.id)
        assert current is not None and current.status is TaskStatus.FAILED
        assert current.error == "lease expired" and current.finished_at is not None
        assert current.alias_of == leader.id

    async def test_retry_refuses_an_alias_and_a_key_another_leader_holds(
        self, storage: TaskStorage
    ) -> None:
        """The redrive rules of ``TaskStorage.retry``: an alias is never redriven, and a
        task whose dedupe key has another active leader waits until that one ends."""
        await storage.enqueue([new_task("t", dedupe_key="k", max_retries=0)])
        (alias,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        (old,) = await storage.claim_batch(claim("t"))
        await storage.finish_batch([finish(old, FinishKind.FAIL, error="x")])
        (new_leader,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert new_leader.alias_of is None
        failed = await storage.get(old.id)
        with pytest.raises(InvalidTransition, match="already active"):
            await storage.retry(old.id)
        with pytest.raises(InvalidTransition, match="alias"):
            await storage.retry(alias.id)
        assert await storage.get(old.id) == failed  # a refused redrive changes nothing
        (running,) = await storage.claim_batch(claim("t"))
        assert running.id == new_leader.id
        await storage.finish_batch([finish(running, FinishKind.FAIL, error="y")])
        redriven = await storage.retry(old.id)
        assert redriven.status is TaskStatus.PENDING and redriven.alias_of is None
        (follower,) = await storage.enqueue([new_task("t", dedupe_key="k")])
        assert follower.alias_of == old.id
