"""The ``postgresql://`` URL and the storage options: what they accept and how they
are checked, before anything connects.

A URL is ``postgresql://user:password@host:port/database?option=value&...`` (or
``postgres://...``). Its query string may hold taskmill's options (:data:`OPTIONS`)
and the libpq connection parameters asyncpg understands (:data:`CONNECTION_PARAMETERS`,
e.g. ``sslmode``); anything else is an :class:`~taskmill.errors.InvalidURL` that lists
what is valid. Keyword options win over the query string.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import attrs
from taskmill.errors import InvalidURL
from taskmill.sql.urls import check_known_options, number_option, redact

__all__ = [
    "CONNECTION_PARAMETERS",
    "OPTIONS",
    "ParsedURL",
    "PostgresOptions",
    "channel_prefix",
    "lock_key",
    "parse_url",
    "quote_ident",
    "redact",
]

SCHEMES: Final = ("postgresql", "postgres")
URL_FORM: Final = "postgresql://user:password@host:5432/database?schema=taskmill"

OPTIONS: Final = {
    "schema": "PostgreSQL schema holding taskmill's tables (default taskmill); "
    "several applications can share one database with a schema each",
    "pool_min_size": "connections the pool keeps open (default 1)",
    "pool_max_size": "most connections the pool opens (default 10)",
    "statement_timeout": "seconds a statement may run before the server cancels it "
    "(default 0: no limit)",
    "connect_timeout": "seconds to wait for a connection (default 10)",
    "command_timeout": "seconds the client waits for any one operation (default: no limit)",
    "application_name": "shown in pg_stat_activity (default taskmill)",
}
"""taskmill's own options, each with what it means (the text of the InvalidURL message)."""

CONNECTION_PARAMETERS: Final = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "dbname",
        "database",
        "passfile",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)
"""libpq parameters passed through to asyncpg in the URL's query string."""

DEFAULT_SCHEMA: Final = "taskmill"
_SCHEMA_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _number(name: str, value: Any, *, minimum: float, integer: bool) -> float:
    return number_option("postgresql", name, value, minimum=minimum, integer=integer)


@attrs.frozen
class PostgresOptions:
    """Validated storage options (see :data:`OPTIONS`)."""

    schema: str = DEFAULT_SCHEMA
    pool_min_size: int = 1
    pool_max_size: int = 10
    statement_timeout: float = 0.0
    connect_timeout: float = 10.0
    command_timeout: float | None = None
    application_name: str = "taskmill"


@attrs.frozen
class ParsedURL:
    """A checked ``postgresql://`` URL: the DSN handed to asyncpg (taskmill's options
    removed) and where it points, for messages that must not show the password."""

    dsn: str
    host: str
    port: str
    database: str
    user: str
    options: PostgresOptions

    @property
    def where(self) -> str:
        """``host:port/database as user``, never the password."""
        return f"{self.host}:{self.port}/{self.database} as user {self.user}"


def _options(raw: dict[str, Any]) -> PostgresOptions:
    check_known_options(
        "postgresql",
        raw,
        OPTIONS,
        also=f"; libpq connection parameters ({', '.join(sorted(CONNECTION_PARAMETERS))}) "
        "may also appear in the URL's query string",
    )
    schema = str(raw.get("schema", DEFAULT_SCHEMA))
    if not _SCHEMA_NAME.match(schema) or schema.lower().startswith("pg_"):
        raise InvalidURL(
            f"postgresql:// option schema must be a plain identifier (letters, digits and "
            f"underscores, at most 63, not starting with a digit or pg_), got {schema!r}"
        )
    min_size = int(_number("pool_min_size", raw.get("pool_min_size", 1), minimum=0, integer=True))
    max_size = int(_number("pool_max_size", raw.get("pool_max_size", 10), minimum=1, integer=True))
    if min_size > max_size:
        raise InvalidURL(
            f"postgresql:// option pool_min_size ({min_size}) is larger than pool_max_size "
            f"({max_size})"
        )
    command = raw.get("command_timeout")
    return PostgresOptions(
        schema=schema,
        pool_min_size=min_size,
        pool_max_size=max_size,
        statement_timeout=_number(
            "statement_timeout", raw.get("statement_timeout", 0), minimum=0, integer=False
        ),
        connect_timeout=_number(
            "connect_timeout", raw.get("connect_timeout", 10), minimum=0.001, integer=False
        ),
        command_timeout=(
            None
            if command in (None, "", "none", "None")
            else _number("command_timeout", command, minimum=0.001, integer=False)
        ),
        application_name=str(raw.get("application_name", "taskmill")),
    )


def parse_url(url: str, keyword_options: dict[str, Any]) -> ParsedURL:
    """Check ``url`` and the keyword options; nothing connects.

    :raises InvalidURL: not a postgresql:// URL, a malformed one, or an unknown or
        invalid option (the message lists the valid ones).
    """
    if not isinstance(url, str):
        raise InvalidURL(f"not a PostgreSQL URL: {url!r}; expected {URL_FORM}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(
            f"malformed PostgreSQL URL {redact(url)!r}: {exc}; expected {URL_FORM}"
        ) from None
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidURL(f"not a PostgreSQL URL: {redact(url)!r}; expected {URL_FORM}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    ours = {k: v for k, v in query.items() if k not in CONNECTION_PARAMETERS}
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    passed = [(k, v) for k, v in pairs if k in CONNECTION_PARAMETERS]
    options = _options({**ours, **keyword_options})
    host = query.get("host") or unquote(parts.hostname or "") or "localhost"
    path_db = unquote(parts.path.lstrip("/"))
    user = query.get("user") or unquote(parts.username or "") or "(default user)"
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(passed), ""))
    return ParsedURL(
        dsn=dsn,
        host=host,
        port=str(query.get("port") or port or 5432),
        database=query.get("dbname") or query.get("database") or path_db or "(default)",
        user=user,
        options=options,
    )


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def lock_key(purpose: str, schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``purpose`` in ``schema``."""
    digest = hashlib.blake2b(f"taskmill:{purpose}:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def channel_prefix(schema: str) -> str:
    """The prefix of the LISTEN/NOTIFY channels of ``schema``: a change of kind ``k``
    (a :class:`~taskmill.storage.StoreChange` value) is notified on ``prefix + k``, at
    most 63 bytes, PostgreSQL's limit."""
    prefix = f"taskmill.{schema}."
    if len(prefix) + len("control") > 63:
        prefix = "taskmill." + hashlib.blake2b(schema.encode(), digest_size=16).hexdigest() + "."
    return prefix
