"""The storage contract and the deployment contract on ``memory://``, the reference
store: the tasks of one process's objects, with no server, file or schema."""

from collections.abc import AsyncIterator

import pytest
from taskmill.backends.memory import MemoryStorage
from taskmill.discovery import storage_for_url
from taskmill.storage import TaskStorage
from taskmill.testing import BadURL, DeploymentContract, StorageContract


class TestMemoryStorage(StorageContract):
    @pytest.fixture
    async def storage(self) -> AsyncIterator[TaskStorage]:
        store = storage_for_url("memory://")
        await store.open()
        yield store
        await store.close()


class TestMemoryDeployment(DeploymentContract):
    """Its URL is all a memory store meets; worker processes skip by its capabilities
    (not ``shared_between_processes``)."""

    storage_class = MemoryStorage
    not_applicable = {
        "schema_versions": "memory:// stores no schema: nothing outlives its object",
        "foreign_data": "memory:// is never pointed at a place another application uses",
        "server": "memory:// has no server to reach and no password",
        "store_enforced_dedupe": (
            "memory:// has no database beneath its code: the code is the only writer"
        ),
    }
    bad_urls = [BadURL("memory://", "memory:// takes no options", {"bogus": 1})]

    @pytest.fixture
    def deployment_url(self) -> str:
        return "memory://"
