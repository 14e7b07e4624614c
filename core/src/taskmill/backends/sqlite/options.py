"""The ``sqlite://`` URL and the storage options: what they accept and how they are
checked, before anything touches the file.

A URL is ``sqlite:///relative/path.db`` (relative to the current directory) or
``sqlite:////absolute/path.db``; its query string may hold the options of
:data:`VALID_OPTIONS`. Keyword options win over the query string.
"""

from __future__ import annotations

import os
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

import attrs

from taskmill.errors import InvalidURL
from taskmill.sql.urls import check_known_options, number_option

__all__ = ["DEFAULT_BUSY_TIMEOUT", "URL_FORM", "VALID_OPTIONS", "SQLiteOptions", "parse_url"]

DEFAULT_BUSY_TIMEOUT: Final = 30.0
SYNCHRONOUS_MODES: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
VALID_OPTIONS: Final = {
    "busy_timeout": "seconds to wait for another process's write lock (default 30)",
    "synchronous": "SQLite synchronous mode: OFF, NORMAL (default), FULL or EXTRA",
}
URL_FORM: Final = (
    "sqlite:///relative/path.db (relative to the current directory) or sqlite:////absolute/path.db"
)


@attrs.frozen
class SQLiteOptions:
    """Validated storage options (see :data:`VALID_OPTIONS`)."""

    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    synchronous: str = "NORMAL"

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> SQLiteOptions:
        """Check options given by name (from the query string or keywords).

        :raises InvalidURL: an unknown option (the message lists the valid ones) or an
            invalid value.
        """
        check_known_options("sqlite", raw, VALID_OPTIONS)
        busy_timeout = number_option(
            "sqlite",
            "busy_timeout",
            raw.get("busy_timeout", DEFAULT_BUSY_TIMEOUT),
            minimum=0,
            integer=False,
        )
        synchronous = str(raw.get("synchronous", "NORMAL")).upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise InvalidURL(
                f"sqlite:// option synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                f"got {raw['synchronous']!r}"
            )
        return cls(busy_timeout=busy_timeout, synchronous=synchronous)


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """The absolute database path and the query-string options of a sqlite:// URL.

    :raises InvalidURL: not a sqlite URL, a URL with a host or without a path, or an
        in-memory / ``file:`` database.
    """
    if not isinstance(url, str) or not url.lower().startswith("sqlite://"):
        raise InvalidURL(f"not a sqlite URL: {url!r}; expected {URL_FORM}")
    rest = url[len("sqlite://") :].split("#", 1)[0]
    rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        if rest:
            raise InvalidURL(f"a sqlite URL has no host part, got {url!r}; expected {URL_FORM}")
        raise InvalidURL(f"the sqlite URL {url!r} names no database file; expected {URL_FORM}")
    path = unquote(rest[1:])
    if not path:
        raise InvalidURL(f"the sqlite URL {url!r} names no database file; expected {URL_FORM}")
    if path == ":memory:" or path.startswith("file:"):
        raise InvalidURL(
            f"{url!r} is not supported: taskmill's SQLite storage needs a database file "
            f"({URL_FORM}); use memory:// for an in-process store"
        )
    options = dict(parse_qsl(query, keep_blank_values=True))
    return os.path.abspath(path), options
