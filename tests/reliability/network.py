"""The server backends the network-fault tests run on, one entry each.

Adding a backend to the network-fault suite is one :data:`NETWORK_BACKENDS` entry: how
to get a fresh store URL for a test, and how its driver's commit looks on the wire (the
client chunk that commits, the server chunk that ends the reply).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import attrs
import pytest

from tests.reliability.fault_proxy import (
    MONGO_COMMIT,
    MYSQL_COMMIT,
    POSTGRES_READY,
    Matcher,
    anything,
    mysql_reply_done,
    postgres_execution_of,
)


@attrs.frozen
class NetworkBackend:
    """A server backend as the network-fault tests see it."""

    name: str
    url_fixture: str
    """The conftest fixture giving a fresh store URL of this test alone."""
    finish_commit: Callable[[], Matcher]
    """A fresh matcher of the client chunk that commits a finish."""
    enqueue_commit: Callable[[], Matcher]
    """A fresh matcher of the client chunk that commits an enqueue."""
    reply_ends: Matcher
    """Matches the server chunk that ends the reply to that commit."""
    extra_query: dict[str, str] = attrs.field(factory=dict)
    """URL options the tests add (client timeouts, so that a black hole is noticed)."""
    driver_retries_commit: bool = False
    """The driver retries a commit whose reply was lost and may learn its outcome, so the
    operation may succeed instead of raising (PyMongo's ``with_transaction``)."""


NETWORK_BACKENDS: dict[str, NetworkBackend] = {
    # A one-round finish or an enqueue is one autocommit statement: it commits at its
    # Execute/Sync.
    "postgres": NetworkBackend(
        "postgres",
        "postgres_url",
        finish_commit=lambda: postgres_execution_of(b".attempts (task_seq, number"),
        enqueue_commit=lambda: postgres_execution_of(b".tasks (id, task_type, status"),
        reply_ends=POSTGRES_READY,
        extra_query={"command_timeout": "5", "connect_timeout": "3"},
    ),
    # Every write is BEGIN ... COMMIT (COM_QUERY), the COMMIT often in one multi-statement
    # packet with deferred writes: the reply ends with the OK that has no more results.
    "mysql": NetworkBackend(
        "mysql",
        "mysql_url",
        finish_commit=lambda: MYSQL_COMMIT,
        enqueue_commit=lambda: MYSQL_COMMIT,
        reply_ends=mysql_reply_done,
        extra_query={"connect_timeout": "3"},
    ),
    # Every write is a transaction (under the writer lock with serializeWrites): it
    # commits with the commitTransaction command; the reply is one OP_MSG.
    "mongo": NetworkBackend(
        "mongo",
        "mongo_url",
        finish_commit=lambda: MONGO_COMMIT,
        enqueue_commit=lambda: MONGO_COMMIT,
        reply_ends=anything,
        extra_query={"connectTimeoutMS": "3000", "socketTimeoutMS": "10000"},
        driver_retries_commit=True,
    ),
}


def server_address(url: str) -> tuple[str, int]:
    """The host and port ``url`` connects to."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


def through(url: str, port: int, extra: dict[str, str] | None = None) -> str:
    """``url`` pointed at 127.0.0.1:``port`` (the proxy), with ``extra`` options added."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    query = parts.query
    for key, value in (extra or {}).items():
        query = f"{query}&{key}={value}" if query else f"{key}={value}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def backend_params() -> list[object]:
    """The pytest parameters of :data:`NETWORK_BACKENDS`."""
    return [pytest.param(b, id=b.name) for b in NETWORK_BACKENDS.values()]
