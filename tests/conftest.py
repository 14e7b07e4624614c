"""Shared fixtures: the backends every API-level test runs against, and the servers the
server backends need.

A test that restarts or kills a server it did not start is marked
``restarts_server(VARIABLE)`` and runs only when ``$VARIABLE`` holds the command to use
(``.ci/run`` sets ``TASKMILL_TEST_POSTGRES_RESTART``).

PostgreSQL tests use ``$TASKMILL_TEST_POSTGRES_URL`` (default
``postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill``); each test gets a fresh
schema of its own, dropped afterwards. MySQL tests use ``$TASKMILL_TEST_MYSQL_URL``
(default ``mysql://taskmill:taskmill@127.0.0.1:3306/taskmill``); each test gets a fresh
database of its own (the URL's database replaced), dropped afterwards. A server that
cannot be reached skips those tests, unless ``$TASKMILL_REQUIRE_BACKENDS`` (a
comma-separated list, set by ``.ci/run``) names the backend: then they fail.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import pytest
from taskmill import Taskmill

T = TypeVar("T")

# A test past its timeout fails with a stack dump and the run goes on (tests/timeouts.py).
pytest_plugins = ["tests.timeouts", "tests.receiver_fixtures"]

API_BACKENDS = ["memory", "sqlite", "postgres", "mysql", "mongo"]

POSTGRES_URL = os.environ.get(
    "TASKMILL_TEST_POSTGRES_URL", "postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill"
)


MYSQL_URL = os.environ.get(
    "TASKMILL_TEST_MYSQL_URL", "mysql://taskmill:taskmill@127.0.0.1:3306/taskmill"
)


def required_backends() -> set[str]:
    """Backends whose tests must fail, not skip, when their server is unreachable."""
    value = os.environ.get("TASKMILL_REQUIRE_BACKENDS", "")
    return {name.strip() for name in value.split(",") if name.strip()}


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a non-interactive shell (``cmd &``, as CI
    runners and ``nohup`` do) inherits SIGINT ignored, and so would every process the
    tests start: their workers then rightly leave SIGINT alone (an ignored signal is
    the parent's choice, see ``taskmill.worker``), and the tests of what SIGINT does
    would fail. The test processes get SIGINT's default back instead."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def skip_or_fail(backend: str, reason: str) -> None:
    """Skip the test, or fail it when ``backend`` is required."""
    if backend in required_backends():
        pytest.fail(f"{reason} (required by TASKMILL_REQUIRE_BACKENDS)", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``restarts_server(VARIABLE)`` restarts or kills a server it did not
    start: it runs only when ``$VARIABLE`` (the command it uses) is set, so that a plain
    run never harms the machine or another run that uses the same server."""
    for mark in item.iter_markers("restarts_server"):
        (variable,) = mark.args
        if not os.environ.get(variable):
            pytest.skip(
                f"restarts a server this run did not start: set {variable} to the "
                "restart command to run it"
            )


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a fresh event loop in a thread of its own
    (usable whether or not an event loop runs in the caller's thread)."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query string."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


async def _postgres_execute(sql: str, url: str = POSTGRES_URL) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@cache
def postgres_unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can (checked once)."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "taskmill-postgres's driver asyncpg is not installed"
    try:
        run_sync(_postgres_execute("SELECT 1"))
    except Exception as exc:
        return f"PostgreSQL at {POSTGRES_URL.split('@')[-1]} is unreachable: {exc}"
    return None


def require_postgres() -> str:
    """The test server's URL; skips (or fails, when required) if it is unreachable."""
    reason = postgres_unreachable()
    if reason is not None:
        skip_or_fail("postgres", reason)
    return POSTGRES_URL


def new_schema_name() -> str:
    return f"tm_test_{uuid.uuid4().hex[:12]}"


def drop_schema(name: str) -> None:
    run_sync(_postgres_execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """The name of a fresh PostgreSQL schema (not created yet), dropped afterwards."""
    require_postgres()
    name = new_schema_name()
    yield name
    drop_schema(name)


@pytest.fixture
def postgres_url(postgres_schema: str) -> str:
    """A URL of the test server for a schema of this test alone."""
    return with_query(POSTGRES_URL, schema=postgres_schema)


async def _mysql_execute(sql: str, url: str = MYSQL_URL) -> None:
    import aiomysql
    from taskmill_mysql.options import parse_url

    p = parse_url(url, {})
    conn = await aiomysql.connect(
        host=p.host, port=p.port, user=p.user, password=p.password, connect_timeout=5
    )
    try:
        async with conn.cursor() as cursor:
            await cursor.execute(sql)
    finally:
        conn.close()


@cache
def mysql_unreachable() -> str | None:
    """Why the MySQL test server cannot be used, or None when it can (checked once)."""
    try:
        import aiomysql  # noqa: F401
    except ImportError:
        return "taskmill-mysql's driver aiomysql is not installed"
    try:
        run_sync(_mysql_execute("SELECT 1"))
    except Exception as exc:
        return f"MySQL at {MYSQL_URL.split('@')[-1]} is unreachable: {exc}"
    return None


def require_mysql() -> str:
    """The MySQL test server's URL; skips (or fails, when required) if unreachable."""
    reason = mysql_unreachable()
    if reason is not None:
        skip_or_fail("mysql", reason)
    return MYSQL_URL


def mysql_url_for(database: str) -> str:
    """The test server's URL with ``database`` in place of its database."""
    base, _, query = MYSQL_URL.partition("?")
    root = base.rsplit("/", 1)[0] if base.count("/") > 2 else base
    return f"{root}/{database}" + (f"?{query}" if query else "")


def drop_database(name: str) -> None:
    run_sync(_mysql_execute(f"DROP DATABASE IF EXISTS `{name}`"))


@pytest.fixture
def mysql_database() -> Iterator[str]:
    """The name of a fresh MySQL database (not created yet), dropped afterwards."""
    require_mysql()
    name = new_schema_name()
    yield name
    drop_database(name)


@pytest.fixture
def mysql_url(mysql_database: str) -> str:
    """A URL of the MySQL test server for a database of this test alone."""
    return mysql_url_for(mysql_database)


def url_for(backend: str, tmp_path: Path) -> str:
    """A fresh, empty store of ``backend`` (for postgres, see ``backend_url``)."""
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    raise ValueError(backend)


@pytest.fixture(params=API_BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "mongo":
        from tests import mongo_server

        require_mongo()
        database = mongo_server.new_database_name()
        yield mongo_server.url_for(database)
        drop_mongo_database(database)
        return
    if request.param == "mysql":
        require_mysql()
        database = new_schema_name()
        yield mysql_url_for(database)
        drop_database(database)
        return
    if request.param != "postgres":
        yield url_for(request.param, tmp_path)
        return
    require_postgres()
    name = new_schema_name()
    yield with_query(POSTGRES_URL, schema=name)
    drop_schema(name)


@pytest.fixture
async def tm(backend_url: str) -> AsyncIterator[Taskmill]:
    """An opened ``Taskmill`` on a fresh store, without plugins."""
    async with Taskmill(backend_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store shared across processes: a SQLite file, or a PostgreSQL schema or
    MySQL database of this test alone (the tests that need real processes or servers
    run on each). MongoDB's multi-process tests are in tests/test_server_multiprocess.py:
    the supervisor and stop-stress tests here kill processes mid-transaction, which
    nx-27017 (the test stand-in, one SQLite connection per database) does not survive
    cleanly (a killed client's open savepoint breaks the next transaction)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    if request.param == "mysql":
        return str(request.getfixturevalue("mysql_url"))
    return str(request.getfixturevalue("postgres_url"))


# tests/backends/ holds example distributions that run their own tests once built and
# installed (tests/test_backend_authoring.py); this run does not collect them.
collect_ignore = ["backends"]


# -- MongoDB ------------------------------------------------------------------------------


@cache
def mongo_unreachable() -> str | None:
    """Why the MongoDB test server cannot be used, or None when it can (checked once)."""
    from tests import mongo_server

    try:
        url = mongo_server.driver_url()
    except RuntimeError as exc:
        return f"no MongoDB test server: {exc}"

    async def ping() -> None:
        from pymongo import AsyncMongoClient

        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            url, serverSelectionTimeoutMS=5000
        )
        try:
            await client.admin.command("ping")
        finally:
            await client.close()

    try:
        run_sync(ping())
    except Exception as exc:
        return f"MongoDB test server unreachable: {exc}"
    return None


def require_mongo() -> str:
    """The MongoDB test server's base URL; skips (or fails) when it is unreachable."""
    from tests import mongo_server

    reason = mongo_unreachable()
    if reason is not None:
        skip_or_fail("mongo", reason)
    return mongo_server.base_url()


def drop_mongo_database(name: str) -> None:
    from tests import mongo_server

    async def drop() -> None:
        from pymongo import AsyncMongoClient

        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            mongo_server.driver_url(), serverSelectionTimeoutMS=5000
        )
        try:
            await client.drop_database(name)
        finally:
            await client.close()

    run_sync(drop())


@pytest.fixture(scope="session", autouse=True)
def _stop_started_mongo() -> Iterator[None]:
    """Stop the nx-27017 this session started (if it started one), by its pid."""
    yield
    from tests import mongo_server

    mongo_server.stop_nx()


@pytest.fixture
def mongo_database() -> Iterator[str]:
    """A fresh database name on the MongoDB test server, dropped after the test."""
    from tests import mongo_server

    require_mongo()
    name = mongo_server.new_database_name()
    yield name
    drop_mongo_database(name)


@pytest.fixture
def mongo_url(mongo_database: str) -> str:
    """The URL of this test's own database on the MongoDB test server."""
    from tests import mongo_server

    return mongo_server.url_for(mongo_database)
