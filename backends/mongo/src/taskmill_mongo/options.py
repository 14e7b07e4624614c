"""``mongodb://`` URLs: the database from the path, taskmill's own options, redaction.

The URL is otherwise the driver's: its query options (``replicaSet``, ``authSource``,
``tls``, ...) go to :class:`pymongo.AsyncMongoClient` unchanged. taskmill's options are
keyword arguments of ``from_url`` (or ``Taskmill(url, **options)``).
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit

import attrs
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_uri
from taskmill.errors import InvalidURL

SCHEMES: Final = ("mongodb", "mongodb+srv")
_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
OPTIONS: Final = ("connect_timeout", "serialize_writes")
SERIALIZE_PARAM: Final = "serializeWrites"
SELECTION_PARAM: Final = "serverSelectionTimeoutMS"
"""The driver's option that taskmill also reads: how long an operation waits for a
usable server (default: the ``connect_timeout`` option)."""
_EXPECTED: Final = "mongodb://[user:password@]host[:port][,host...]/database[?driver options]"


@attrs.frozen
class MongoOptions:
    """A parsed URL."""

    url: str
    database: str
    connect_timeout: float = 10.0
    """Seconds to find a usable server (and to connect) before an operation gives up
    with :class:`~taskmill.errors.StorageUnavailable`."""
    serialize_writes: bool = False
    """Run one transaction at a time across every process (a lock document taken
    before each). Only for servers whose concurrent transactions are not isolated from
    each other, as nx-27017's (one SQLite connection per database) are not; MongoDB
    does not need it. Also ``?serializeWrites=true`` in the URL.

    The one switch for every workaround of the stand-in, none of which runs without it:
    the :mod:`~taskmill_mongo.writer_lock` around each transaction and read; a write
    that opens each transaction (the stand-in starts one only on a write); events
    stamped with the lock's turn (the stand-in reports no cluster time); a rate
    bucket upserted and read in two commands (it ignores ``$setOnInsert`` in an
    upserting ``find_one_and_update``); and a lease check that reads tasks and
    suspensions with two finds instead of one aggregation."""
    driver_url: str = ""
    """The URL passed to the driver (taskmill's query options removed)."""
    server_selection_timeout: float | None = None
    """Seconds to find a usable server before an operation gives up, when the URL sets
    it (``?serverSelectionTimeoutMS=2000``); None: ``connect_timeout``."""


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and reprs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return url.replace(netloc, f"{user}:***@{hosts}", 1)


def parse_url(url: str, options: dict[str, Any]) -> MongoOptions:
    """Check ``url`` and taskmill's ``options``.

    :raises InvalidURL: not a MongoDB URL, no (or a bad) database name, a malformed URL
        or an unknown option; the message shows the expected form without the password.
    """
    shown = redact(url)
    scheme = url.partition("://")[0]
    if scheme not in SCHEMES:
        raise InvalidURL(f"{shown} is not a MongoDB URL; expected {_EXPECTED}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidURL(
            f"unknown mongodb:// option(s) {', '.join(unknown)} for {shown}; "
            f"valid options are: {', '.join(OPTIONS)}"
        )
    serialize = options.get("serialize_writes", False)
    selection_timeout: float | None = None
    driver_url = url
    base, sep, query = url.partition("?")
    if sep:
        kept = []
        for item in query.split("&"):
            name, _, value = item.partition("=")
            if name == SERIALIZE_PARAM:
                if value.lower() not in ("true", "false", "1", "0"):
                    raise InvalidURL(f"{SERIALIZE_PARAM} must be true or false in {shown}")
                serialize = value.lower() in ("true", "1")
                continue
            if name.lower() == SELECTION_PARAM.lower():
                selection_timeout = _milliseconds(value, shown)
            if item:
                kept.append(item)
        driver_url = base + ("?" + "&".join(kept) if kept else "")
    if not isinstance(serialize, bool):
        raise InvalidURL(f"serialize_writes must be True or False, got {serialize!r}")
    try:
        if scheme == "mongodb":  # an SRV URL's hosts are looked up when the client connects
            parse_uri(driver_url)
        database = urlsplit(driver_url).path.lstrip("/") or None
    except (InvalidURI, ConfigurationError, ValueError) as exc:
        message = str(exc).replace(url, shown)
        raise InvalidURL(
            f"malformed MongoDB URL {shown}: {message}; expected {_EXPECTED}"
        ) from None
    if not database:
        raise InvalidURL(f"{shown} names no database; expected {_EXPECTED}")
    if not _NAME.match(database):
        raise InvalidURL(
            f"database name {database!r} in {shown} must be a plain name of letters, "
            "digits, '_' or '-' (at most 63)"
        )
    timeout = options.get("connect_timeout", 10.0)
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        timeout = -1.0
    if not timeout > 0:
        raise InvalidURL(f"connect_timeout must be a number of seconds > 0, got {timeout!r}")
    return MongoOptions(
        url=url,
        database=database,
        connect_timeout=timeout,
        serialize_writes=serialize,
        driver_url=driver_url,
        server_selection_timeout=selection_timeout,
    )


def _milliseconds(value: str, shown: str) -> float:
    """Seconds from the milliseconds of a URL's ``serverSelectionTimeoutMS``."""
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise InvalidURL(
            f"{SELECTION_PARAM} must be a number of milliseconds > 0 in {shown}, got {value!r}"
        )
    return ms / 1000
