from collections.abc import AsyncIterator

import pytest
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.storage import TaskStorage
from taskmill.testing import StorageContract


class TestSQLiteStorage(StorageContract):
    @pytest.fixture
    async def storage(self, tmp_path) -> AsyncIterator[TaskStorage]:
        store = SQLiteStorage.from_url(f"sqlite:///{tmp_path / 'tasks.db'}")
        await store.open()
        yield store
        await store.close()
