"""Contract: how a store meets the place it is deployed in.

:class:`~taskmill.testing.StorageContract` proves the semantics of the operations on an
opened, empty store. A store also meets things no operation controls: a schema written
by an older or a newer release, another application's tables where it was pointed, a
server that does not answer, a URL with a typo, several worker processes on one store,
and a database that must enforce the dedupe rule even against a writer that bypasses
the code. :class:`DeploymentContract` proves those, once for every backend, through a
few hooks (:class:`DeploymentHooks`) that only the backend's tests can fill in: they
reach behind the store's back (write a version marker, plant a table, insert a row).

Every scenario either runs or is declared not applicable, with the reason, in
``not_applicable`` (memory:// has no server); its tests are then skipped with that
reason. A hook a scenario needs that is neither given nor declared fails the test that
needs it: nothing is skipped silently. Each scenario is also a class of its own
(:class:`SchemaVersionContract`, :class:`ForeignDataContract`, :class:`ServerContract`,
:class:`URLContract`, :class:`WorkerProcessContract`,
:class:`StoreEnforcedDedupeContract`), which :class:`DeploymentContract` combines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NoReturn, TypeAlias, TypeVar, get_args
from urllib.parse import urlsplit, urlunsplit

import attrs
import pytest

from taskmill.discovery import storage_for_url
from taskmill.errors import InvalidURL, SchemaVersionError, StorageUnavailable
from taskmill.model import Task, TaskFilter, TaskStatus
from taskmill.sql.urls import redact
from taskmill.storage import TaskStorage
from taskmill.testing.capabilities import missing_capabilities, requires
from taskmill.testing.helpers import claim, new_task

__all__ = [
    "SCENARIOS",
    "BadURL",
    "DeploymentContract",
    "DeploymentHooks",
    "ForeignDataContract",
    "Scenario",
    "SchemaVersionContract",
    "ServerContract",
    "StoreEnforcedDedupeContract",
    "URLContract",
    "WorkerProcessContract",
]

Scenario: TypeAlias = Literal[
    "schema_versions",
    "foreign_data",
    "server",
    "urls",
    "worker_processes",
    "store_enforced_dedupe",
]
"""A deployment scenario, as ``not_applicable`` names it."""

SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)

F = TypeVar("F", bound=Callable[..., Any])

_SCENARIO = "__taskmill_scenario__"

_DEADLINE = 120.0
"""Seconds any one step of a scenario gets (an open, the processes' race)."""


def _scenario(name: Scenario) -> Callable[[F], F]:
    """Mark a test as one of scenario ``name``'s."""

    def mark(test: F) -> F:
        setattr(test, _SCENARIO, name)
        return test

    return mark


@attrs.frozen
class BadURL:
    """A URL (with keyword options) that ``from_url`` refuses with ``InvalidURL``."""

    url: str
    message: str
    """A regular expression the ``InvalidURL`` message matches (``pytest.raises(match=)``)."""
    options: Mapping[str, Any] = attrs.field(factory=dict)

    def __str__(self) -> str:
        shown = ",".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{self.url} {shown}".strip()


class DeploymentHooks:
    """What a backend's deployment test class fills in.

    Always: ``storage_class`` and the ``deployment_url`` fixture. The other hooks only
    for the scenarios that apply; ``not_applicable`` names the others, each with the
    reason shown when their tests skip.
    """

    pytestmark = pytest.mark.asyncio

    storage_class: ClassVar[type[TaskStorage]]
    """The backend's storage class: the tests build stores with its ``from_url``."""

    not_applicable: ClassVar[Mapping[Scenario, str]] = {}
    """The scenarios that do not apply to this backend, each with the reason."""

    distribution: ClassVar[str]
    """(schema_versions) The distribution a user upgrades when the code is older than
    the stored schema: the advice is ``pip install --upgrade <distribution>``."""

    unreachable_options: ClassVar[Mapping[str, Any]] = {}
    """(server) Keyword options for the unreachable URL (a short connect timeout)."""

    bad_urls: ClassVar[Sequence[BadURL]]
    """(urls) URLs and options that ``from_url`` must refuse, with the messages."""

    unique_violation: ClassVar[tuple[type[BaseException], str]]
    """(store_enforced_dedupe) What the database raises when a write behind the store's
    back would make a second active leader: the exception type and a regular
    expression its message matches (the constraint's name, say)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = sorted(set(cls.not_applicable) - set(SCENARIOS))
        if unknown:
            raise TypeError(
                f"{cls.__name__}.not_applicable names unknown scenarios {', '.join(unknown)}; "
                f"known: {', '.join(SCENARIOS)}"
            )

    @pytest.fixture
    def deployment_url(self) -> str:
        """The URL of a store of this test alone that does not exist yet (no schema,
        database or file), removed after the test by whatever the fixture arranges."""
        self._missing("deployment_url", "every scenario")

    async def set_schema_version(self, url: str, version: int) -> None:
        """(schema_versions) Record ``version`` as the schema version of the existing
        store at ``url``, behind the store's back, as an older or a newer release of
        the backend would have left it."""
        self._missing("set_schema_version", "schema_versions")

    async def footprint(self, url: str) -> object:
        """(schema_versions, foreign_data) Everything stored at ``url`` (the names and
        the contents of its tables or collections, the bytes of its file) as a value
        compared with ``==``: an open or a migration that is refused leaves it equal."""
        self._missing("footprint", "schema_versions and foreign_data")

    async def plant_foreign_data(self, url: str) -> str:
        """(foreign_data) Create at ``url`` what another application keeps there (a
        schema or database with a table of its own, a SQLite file with its own table);
        return the name of what was planted, which the refusal must name."""
        self._missing("plant_foreign_data", "foreign_data")

    def unreachable_url(self) -> str:
        """(server) A URL with a user and a password, of a server that does not answer
        (port 1 on 127.0.0.1, say)."""
        self._missing("unreachable_url", "server")

    async def insert_active_task(
        self, storage: TaskStorage, leader: Task, *, dedupe_key: str
    ) -> None:
        """(store_enforced_dedupe) Write straight into the database, bypassing the
        store's code, a PENDING task with a new id and ``leader``'s task type and app but
        dedupe key ``dedupe_key``; let the database's error out."""
        self._missing("insert_active_task", "store_enforced_dedupe")

    def _missing(self, hook: str, scenarios: str) -> NoReturn:
        raise NotImplementedError(
            f"{type(self).__name__} gives no `{hook}` hook ({scenarios}): give it, or "
            "declare the scenario in `not_applicable` with the reason"
        )

    @pytest.fixture(autouse=True)
    def _skip_what_does_not_apply(self, request: pytest.FixtureRequest) -> None:
        scenario: Scenario | None = getattr(request.function, _SCENARIO, None)
        if scenario is not None and scenario in self.not_applicable:
            pytest.skip(
                f"{type(self).__name__} declares {scenario} not applicable: "
                f"{self.not_applicable[scenario]}"
            )

    @contextlib.asynccontextmanager
    async def _opened(self, url: str, **options: Any) -> AsyncIterator[TaskStorage]:
        """A store of ``storage_class`` on ``url``, open for the block."""
        store = self.storage_class.from_url(url, **options)
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    async def _create_with_a_task(self, url: str) -> tuple[Task, int]:
        """Create the store at ``url`` holding one task: that task and the schema
        version the code expects."""
        async with self._opened(url) as store:
            (task,) = await store.enqueue([new_task()])
            return task, await store.migrate()

    async def _still_holds(self, url: str, task: Task) -> None:
        """Open the store at ``url`` (no migration) and find ``task`` unchanged."""
        async with self._opened(url) as store:
            assert await store.get(task.id) == task


def _password_of(url: str) -> str | None:
    return urlsplit(url).password


def _assert_hides_password(url: str, message: str) -> None:
    password = _password_of(url)
    if password:
        assert f":{password}@" not in message, message
        if password not in redact(url):  # not also the user's or the database's name
            assert password not in message, message


def _names_versions(message: str, stored: int, expected: int) -> None:
    assert f"version {stored}" in message, message
    assert re.search(rf"\b{expected}\b", message), message


class SchemaVersionContract(DeploymentHooks):
    """A schema of another release is refused, saying what to run, and left as it was."""

    @_scenario("schema_versions")
    async def test_an_older_schema_is_refused_with_the_migrate_command(
        self, deployment_url: str
    ) -> None:
        url = deployment_url
        task, latest = await self._create_with_a_task(url)
        await self.set_schema_version(url, 0)
        before = await self.footprint(url)
        refused = self.storage_class.from_url(url)
        try:
            with pytest.raises(SchemaVersionError) as excinfo:
                await refused.open()
            with pytest.raises(StorageUnavailable, match="not open"):
                await refused.get(task.id)
        finally:
            await refused.close()
        message = str(excinfo.value)
        assert f"taskmill migrate --url {redact(url)}" in message, message
        _assert_hides_password(url, message)
        _names_versions(message, 0, latest)
        assert await self.footprint(url) == before, "a refused open wrote"
        await self.set_schema_version(url, latest)
        await self._still_holds(url, task)

    @_scenario("schema_versions")
    async def test_auto_migrate_and_migrate_bring_an_older_schema_up(
        self, deployment_url: str
    ) -> None:
        url = deployment_url
        task, latest = await self._create_with_a_task(url)
        for bring_up in ("auto_migrate", "migrate"):
            await self.set_schema_version(url, 0)
            refused = self.storage_class.from_url(url)
            with pytest.raises(SchemaVersionError, match="taskmill migrate"):
                await refused.open()
            await refused.close()
            store = self.storage_class.from_url(url)
            if bring_up == "migrate":
                assert await store.migrate() == latest  # on a store not opened
                await store.open()
            else:
                await store.open(auto_migrate=True)
            try:
                assert await store.get(task.id) == task, bring_up
            finally:
                await store.close()
            await self._still_holds(url, task)  # the version is recorded: a plain open

    @_scenario("schema_versions")
    async def test_a_newer_schema_is_refused_with_upgrade_advice(self, deployment_url: str) -> None:
        url = deployment_url
        task, latest = await self._create_with_a_task(url)
        newer = latest + 1
        await self.set_schema_version(url, newer)
        before = await self.footprint(url)
        store = self.storage_class.from_url(url)
        attempts: dict[str, Callable[[], Awaitable[object]]] = {
            "open": store.open,
            "open(auto_migrate=True)": lambda: store.open(auto_migrate=True),
            "migrate": store.migrate,
        }
        try:
            for name, attempt in attempts.items():
                with pytest.raises(SchemaVersionError) as excinfo:
                    await attempt()
                message = str(excinfo.value)
                assert f"pip install --upgrade {self.distribution}" in message, (name, message)
                assert f"version {newer}" in message, (name, message)
                _assert_hides_password(url, message)
        finally:
            await store.close()
        assert await self.footprint(url) == before, "a refused open or migrate wrote"
        await self.set_schema_version(url, latest)
        await self._still_holds(url, task)


class ForeignDataContract(DeploymentHooks):
    """Another application's data where the URL points is refused and never touched."""

    @_scenario("foreign_data")
    async def test_another_applications_data_is_left_untouched(self, deployment_url: str) -> None:
        url = deployment_url
        planted = await self.plant_foreign_data(url)
        before = await self.footprint(url)
        store = self.storage_class.from_url(url)
        attempts: dict[str, Callable[[], Awaitable[object]]] = {
            "open": store.open,
            "open(auto_migrate=True)": lambda: store.open(auto_migrate=True),
            "migrate": store.migrate,
        }
        try:
            for name, attempt in attempts.items():
                with pytest.raises(StorageUnavailable, match="not a taskmill") as excinfo:
                    await attempt()
                assert planted in str(excinfo.value), (name, str(excinfo.value))
                _assert_hides_password(url, str(excinfo.value))
        finally:
            await store.close()
        assert await self.footprint(url) == before, "another application's data was changed"


class ServerContract(DeploymentHooks):
    """A server that cannot be used is ``StorageUnavailable``, saying where, never how
    to log in."""

    @_scenario("server")
    async def test_an_unreachable_server_is_unavailable_naming_host_and_port(self) -> None:
        url = self.unreachable_url()
        parts = urlsplit(url)
        store = self.storage_class.from_url(url, **self.unreachable_options)
        try:
            async with asyncio.timeout(_DEADLINE):  # were it to hang
                with pytest.raises(StorageUnavailable) as excinfo:
                    await store.open()
            with pytest.raises(StorageUnavailable, match="not open"):
                await store.get("x")
        finally:
            await store.close()
        message = str(excinfo.value)
        assert f"{parts.hostname}:{parts.port}{parts.path}" in message, message
        _assert_hides_password(url, message)

    @_scenario("server")
    async def test_a_password_never_shows(self) -> None:
        url = self.unreachable_url()
        password = _password_of(url)
        assert password, f"unreachable_url() should have a password: {url}"
        assert password not in repr(self.storage_class.from_url(url))
        with pytest.raises(InvalidURL) as excinfo:
            self.storage_class.from_url(url, no_such_option=1)
        assert password not in str(excinfo.value)

    @_scenario("server")
    async def test_a_wrong_password_is_unavailable_without_showing_it(
        self, deployment_url: str
    ) -> None:
        parts = urlsplit(deployment_url)
        if parts.password is None:
            pytest.skip("the test server's URL has no password to change")
        host = parts.netloc.rsplit("@", 1)[1]
        wrong = urlunsplit(parts._replace(netloc=f"{parts.username}:WrongPassword@{host}"))
        store = self.storage_class.from_url(wrong)
        try:
            async with asyncio.timeout(_DEADLINE):
                with pytest.raises(StorageUnavailable) as excinfo:
                    await store.open()
        finally:
            await store.close()
        message = str(excinfo.value)
        assert "WrongPassword" not in message
        assert "password" in message and f"user {parts.username}" in message, message


class URLContract(DeploymentHooks):
    """A URL or an option the backend does not understand is refused, never ignored."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """One test per entry of ``bad_urls`` (none when the class gives none, so that
        the single test left fails, asking for it, or skips when declared)."""
        if "bad_url" not in metafunc.fixturenames:
            return
        cases: Sequence[BadURL | None] = getattr(self, "bad_urls", None) or [None]
        metafunc.parametrize("bad_url", cases, ids=[str(c) for c in cases])

    @_scenario("urls")
    async def test_bad_urls_and_options_are_invalid(self, bad_url: BadURL | None) -> None:
        if bad_url is None:
            self._missing("bad_urls", "urls")
        with pytest.raises(InvalidURL, match=bad_url.message) as excinfo:
            self.storage_class.from_url(bad_url.url, **bad_url.options)
        _assert_hides_password(bad_url.url, str(excinfo.value))


def _claiming_process() -> None:
    """One worker process of the race (``python -c``): open the store at ``argv[1]`` by
    URL, say ``ready``, wait for a line, claim batches of five as worker ``argv[2]``
    until nothing is left, and print the ids claimed as JSON."""
    url, worker = sys.argv[1:3]

    async def run() -> list[str]:
        store = storage_for_url(url)
        await store.open()
        try:
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
            claimed: list[str] = []
            while batch := await store.claim_batch(claim(worker=worker, limit=5, lease=600)):
                claimed += [t.id for t in batch]
            return claimed
        finally:
            await store.close()

    print(json.dumps(asyncio.run(run())), flush=True)


_PROCESS = "from taskmill.testing.deployment import _claiming_process; _claiming_process()"


async def _race(url: str, workers: Sequence[str]) -> list[list[str]]:
    """Start one claiming process per worker, release them together once every one has
    opened the store, and return what each claimed. Every process is ended."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        for worker in workers:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    _PROCESS,
                    url,
                    worker,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        async with asyncio.timeout(_DEADLINE):
            for proc in procs:
                assert proc.stdout is not None
                if (await proc.stdout.readline()).strip() != b"ready":
                    _, err = await proc.communicate()
                    raise AssertionError(f"a claiming process failed to open:\n{err.decode()}")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            outputs = await asyncio.gather(*(proc.communicate() for proc in procs))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    return [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]


class WorkerProcessContract(DeploymentHooks):
    """Worker processes racing for one store's tasks never share one. The processes
    open the store by its URL, through the backend's entry point, as a user's do."""

    @_scenario("worker_processes")
    @requires("shared_between_processes")
    async def test_worker_processes_never_claim_the_same_task(
        self, deployment_url: str, request: pytest.FixtureRequest
    ) -> None:
        reason = missing_capabilities(self.storage_class.from_url(deployment_url), request.function)
        if reason is not None:
            pytest.skip(reason)
        async with self._opened(deployment_url) as store:
            expected = {t.id for t in await store.enqueue([new_task() for _ in range(900)])}
            workers = ["p0", "p1", "p2"]
            claimed = await _race(store.url, workers)
            ids = [task_id for got in claimed for task_id in got]
            assert len(ids) == len(set(ids)) == len(expected)
            assert set(ids) == expected
            held = {t.id: t for t in await store.query(TaskFilter(), limit=len(expected) + 1)}
            for worker, got in zip(workers, claimed, strict=True):
                assert {(held[i].status, held[i].worker_id) for i in got} <= {
                    (TaskStatus.RUNNING, worker)
                }


class StoreEnforcedDedupeContract(DeploymentHooks):
    """The database itself, not only the store's code, keeps one active leader per
    dedupe key: a writer that bypasses the code (another release, a hand-written fix)
    cannot make a second."""

    @_scenario("store_enforced_dedupe")
    async def test_the_database_itself_refuses_a_second_active_leader(
        self, deployment_url: str
    ) -> None:
        async with self._opened(deployment_url) as store:
            (leader,) = await store.enqueue([new_task("t", app_id="a", dedupe_key="k")])
            # The same row with a key of its own is accepted: what is refused next is
            # the key, not the way the row is written.
            await self.insert_active_task(store, leader, dedupe_key="another key")
            error, message = self.unique_violation
            with pytest.raises(error, match=message):
                await self.insert_active_task(store, leader, dedupe_key="k")
            assert await store.get(leader.id) == leader
            assert leader.alias_of is None


class DeploymentContract(
    SchemaVersionContract,
    ForeignDataContract,
    ServerContract,
    URLContract,
    WorkerProcessContract,
    StoreEnforcedDedupeContract,
):
    """Every deployment scenario. Subclass it with ``storage_class``, the
    ``deployment_url`` fixture and the hooks of :class:`DeploymentHooks` for each
    scenario that applies; name the others in ``not_applicable``."""
