from collections.abc import AsyncIterator

import pytest
from taskmill.discovery import storage_for_url
from taskmill.storage import TaskStorage
from taskmill.testing import StorageContract


class TestMemoryStorage(StorageContract):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[TaskStorage]:
        store = storage_for_url("memory://")
        await store.open()
        yield store
        await store.close()
