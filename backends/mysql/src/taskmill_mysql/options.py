"""The ``mysql://`` URL and the storage options: what they accept and how they are
checked, before anything connects.

A URL is ``mysql://user:password@host:port/database?option=value&...`` (or
``mariadb://...``). The database in the path is where taskmill keeps its tables (one
store per database; it is created by ``migrate`` when missing). The query string may
hold taskmill's options (:data:`OPTIONS`); anything else is an
:class:`~taskmill.errors.InvalidURL` that lists what is valid. Keyword options win over
the query string.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs
from taskmill.errors import InvalidURL
from taskmill.sql.urls import check_known_options, number_option, redact

__all__ = ["OPTIONS", "MySQLOptions", "ParsedURL", "parse_url", "quote_ident", "redact"]

SCHEMES: Final = ("mysql", "mariadb")
URL_FORM: Final = "mysql://user:password@host:3306/database"

OPTIONS: Final = {
    "pool_min_size": "connections the pool keeps open (default 1)",
    "pool_max_size": "most connections the pool opens (default 10)",
    "connect_timeout": "seconds to wait for a connection (default 10)",
    "lock_wait_timeout": "seconds a statement waits for a row lock before the server "
    "gives up (innodb_lock_wait_timeout, default 10); such a transaction is run again",
    "charset": "the connection character set (default utf8mb4)",
}
"""taskmill's own options, each with what it means (the text of the InvalidURL message)."""

DEFAULT_DATABASE: Final = "taskmill"
_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _number(name: str, value: Any, *, minimum: float, integer: bool) -> float:
    return number_option("mysql", name, value, minimum=minimum, integer=integer)


@attrs.frozen
class MySQLOptions:
    """Validated storage options (see :data:`OPTIONS`)."""

    pool_min_size: int = 1
    pool_max_size: int = 10
    connect_timeout: float = 10.0
    lock_wait_timeout: int = 10
    charset: str = "utf8mb4"


@attrs.frozen
class ParsedURL:
    """A checked ``mysql://`` URL: where it points and the credentials aiomysql takes,
    for messages that must not show the password."""

    host: str
    port: int
    database: str
    user: str
    password: str
    options: MySQLOptions

    @property
    def where(self) -> str:
        """``host:port/database as user``, never the password."""
        return f"{self.host}:{self.port}/{self.database} as user {self.user}"


def _options(raw: dict[str, Any]) -> MySQLOptions:
    check_known_options("mysql", raw, OPTIONS)
    min_size = int(_number("pool_min_size", raw.get("pool_min_size", 1), minimum=0, integer=True))
    max_size = int(_number("pool_max_size", raw.get("pool_max_size", 10), minimum=1, integer=True))
    if min_size > max_size:
        raise InvalidURL(
            f"mysql:// option pool_min_size ({min_size}) is larger than pool_max_size ({max_size})"
        )
    charset = str(raw.get("charset", "utf8mb4"))
    if not _NAME.match(charset):
        raise InvalidURL(f"mysql:// option charset must be a character set name, got {charset!r}")
    return MySQLOptions(
        pool_min_size=min_size,
        pool_max_size=max_size,
        connect_timeout=_number(
            "connect_timeout", raw.get("connect_timeout", 10), minimum=0.001, integer=False
        ),
        lock_wait_timeout=int(
            _number("lock_wait_timeout", raw.get("lock_wait_timeout", 10), minimum=1, integer=True)
        ),
        charset=charset,
    )


def parse_url(url: str, keyword_options: dict[str, Any]) -> ParsedURL:
    """Check ``url`` and the keyword options; nothing connects.

    :raises InvalidURL: not a mysql:// URL, a malformed one, a database name that is not
        a plain identifier, or an unknown or invalid option (the message lists the
        valid ones).
    """
    if not isinstance(url, str):
        raise InvalidURL(f"not a MySQL URL: {url!r}; expected {URL_FORM}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(
            f"malformed MySQL URL {redact(url)!r}: {exc}; expected {URL_FORM}"
        ) from None
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidURL(f"not a MySQL URL: {redact(url)!r}; expected {URL_FORM}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    options = _options({**query, **keyword_options})
    database = unquote(parts.path.lstrip("/")) or DEFAULT_DATABASE
    if not _NAME.match(database):
        raise InvalidURL(
            "the database of a mysql:// URL must be a plain identifier (letters, digits and "
            f"underscores, at most 64, not starting with a digit), got {database!r}"
        )
    return ParsedURL(
        host=unquote(parts.hostname or "") or "localhost",
        port=port or 3306,
        database=database,
        user=unquote(parts.username or "") or "root",
        password=unquote(parts.password or ""),
        options=options,
    )


def quote_ident(name: str) -> str:
    """``name`` as a quoted MySQL identifier."""
    return "`" + name.replace("`", "``") + "`"
