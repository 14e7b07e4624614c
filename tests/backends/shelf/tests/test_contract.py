"""taskmill-shelf against the whole shipped contract suite: one subclass, one fixture."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from taskmill.storage import TaskStorage
from taskmill.testing import StorageContract
from taskmill_shelf import ShelfStorage


class TestShelfStorage(StorageContract):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[TaskStorage]:
        store = ShelfStorage.from_url(f"shelf://{tmp_path / 'tasks.shelf'}")
        await store.open()
        yield store
        await store.close()
