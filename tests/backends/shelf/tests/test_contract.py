"""taskmill-shelf against the whole shipped contract suite: one subclass, one fixture;
and against the deployment scenarios a file shared by processes meets."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from taskmill.storage import TaskStorage
from taskmill.testing import BadURL, StorageContract, URLContract, WorkerProcessContract
from taskmill_shelf import ShelfStorage


class TestShelfStorage(StorageContract):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[TaskStorage]:
        store = ShelfStorage.from_url(f"shelf://{tmp_path / 'tasks.shelf'}")
        await store.open()
        yield store
        await store.close()


class TestShelfDeployment(URLContract, WorkerProcessContract):
    """The deployment scenarios that apply to a store in one file: its URL, and worker
    processes sharing it. It has no server, no schema versions to migrate (one file
    layout), and no database beneath its code to enforce dedupe, so it takes only these
    two scenario classes of ``DeploymentContract``."""

    storage_class = ShelfStorage
    bad_urls = [
        BadURL("shelf://", "expected shelf:///path/to/file"),
        BadURL("shelf:///", "expected shelf:///path/to/file"),
        BadURL("shelf://host/tasks.shelf", "expected shelf:///path/to/file"),
        BadURL("shelf:///tmp/tasks.shelf?mode=fast", "takes no options"),
        BadURL("shelf:///tmp/tasks.shelf", "takes no options", {"mode": "fast"}),
    ]

    @pytest.fixture
    def deployment_url(self, tmp_path: Path) -> str:
        return f"shelf://{tmp_path / 'tasks.shelf'}"
