"""Contract: handler registrations kept in the store (capability
``handler_registrations``; part of :class:`~taskmill.testing.StorageContract`)."""

from __future__ import annotations

from taskmill.storage import HandlerRegistration, TaskStorage
from taskmill.testing.capabilities import requires

__all__ = ["HandlerRegistrationContract"]


class HandlerRegistrationContract:
    """What ``put/delete_handler_registration`` and ``handler_registrations`` do."""

    @requires("handler_registrations")
    async def test_a_registration_is_stored_with_its_options_and_the_store_clock(
        self, storage: TaskStorage
    ) -> None:
        assert await storage.handler_registrations() == []
        stored = await storage.put_handler_registration(
            HandlerRegistration(
                task_type="thumb",
                url="http://127.0.0.1:9000/run",
                app_id="photos",
                timeout=2.5,
                max_retries=4,
                concurrency=3,
            )
        )
        assert stored.updated_at is not None and stored.updated_at.tzinfo is not None
        (found,) = await storage.handler_registrations()
        assert found == stored
        assert (found.url, found.timeout, found.max_retries, found.concurrency) == (
            "http://127.0.0.1:9000/run",
            2.5,
            4,
            3,
        )

    @requires("handler_registrations")
    async def test_putting_the_same_key_replaces_it_and_keys_are_app_scoped(
        self, storage: TaskStorage
    ) -> None:
        await storage.put_handler_registration(HandlerRegistration("t", "http://a/1"))
        await storage.put_handler_registration(HandlerRegistration("t", "http://b/1", app_id="x"))
        await storage.put_handler_registration(HandlerRegistration("t", "http://a/2"))
        await storage.put_handler_registration(HandlerRegistration("u", "http://c", app_id=""))
        found = await storage.handler_registrations()
        assert [(r.app_id, r.task_type, r.url) for r in found] == [
            (None, "t", "http://a/2"),
            ("", "u", "http://c"),
            ("x", "t", "http://b/1"),
        ]

    @requires("handler_registrations")
    async def test_delete_removes_exactly_one_key(self, storage: TaskStorage) -> None:
        await storage.put_handler_registration(HandlerRegistration("t", "http://a"))
        await storage.put_handler_registration(HandlerRegistration("t", "http://b", app_id="x"))
        assert await storage.delete_handler_registration("x", "t") is True
        assert await storage.delete_handler_registration("x", "t") is False
        assert await storage.delete_handler_registration("y", "t") is False
        assert [r.app_id for r in await storage.handler_registrations()] == [None]
