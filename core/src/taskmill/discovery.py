"""Finding a storage backend for a URL through the ``taskmill.backends`` entry points.

The entry point's name is the URL scheme it serves and its value names a
:class:`~taskmill.storage.TaskStorage` subclass. The core knows backends only by that
name; first-party backends are found exactly the way a third party's would be.
"""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points
from typing import Any
from urllib.parse import urlsplit

from taskmill.errors import BackendNotInstalled, InvalidURL
from taskmill.storage import TaskStorage

ENTRY_POINT_GROUP = "taskmill.backends"
DEFAULT_URL = "sqlite:///taskmill.db"

# Schemes of first-party backends shipped as separate distributions: the error for a
# missing one names the package to install.
KNOWN_PACKAGES: dict[str, str] = {
    "postgresql": "taskmill-postgres",
    "postgres": "taskmill-postgres",
    "mysql": "taskmill-mysql",
    "mariadb": "taskmill-mysql",
    "mongodb": "taskmill-mongo",
    "mongodb+srv": "taskmill-mongo",
}


def resolve_url(url: str | None) -> str:
    """The URL to use: the one given, else ``$TASKMILL_URL``, else the SQLite default."""
    return url or os.environ.get("TASKMILL_URL") or DEFAULT_URL


def url_scheme(url: str) -> str:
    """The lowercase scheme of a storage URL.

    :raises InvalidURL: the URL has no scheme; for what looks like a file path, the
        message offers the ``sqlite:///`` URL of that file.
    """
    if not isinstance(url, str) or "://" not in url:
        hint = ""
        if isinstance(url, str) and _looks_like_a_path(url):
            try:
                path = os.path.expanduser(url)
            except ValueError:  # "~name" with a NUL byte: no such user to look up
                path = url
            hint = f"; did you mean sqlite:///{path}?"
        raise InvalidURL(
            f"not a storage URL: {url!r}{hint}; expected scheme://..., e.g. "
            "sqlite:///tasks.db (a file in the current directory), "
            "sqlite:////srv/tasks.db (an absolute path), memory://, "
            "postgresql://user@host/db"
        )
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:  # e.g. an unbalanced "[" (an IPv6 host)
        raise InvalidURL(
            f"malformed storage URL {url!r}: {exc}; expected scheme://..., e.g. "
            "sqlite:///tasks.db or postgresql://user@host/db"
        ) from None
    return scheme.lower() or url.split("://", 1)[0].lower()


def _looks_like_a_path(text: str) -> bool:
    """A bare file name or path, such as ``tasks.db``, ``./x/tasks.sqlite`` or
    ``/srv/tasks.db`` (not ``host:port`` or a URL missing its ``//``)."""
    if not text or ":" in text:
        return False
    return (
        text.startswith(("/", "./", "../", "~"))
        or text.lower().endswith((".db", ".sqlite", ".sqlite3"))
        or os.path.exists(text)
    )


def _entry_point(scheme: str) -> EntryPoint | None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep
    return None


def installed_schemes() -> list[str]:
    """URL schemes served by the backends installed in this environment."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def storage_class(url: str) -> type[TaskStorage]:
    """The storage class registered for ``url``'s scheme.

    :raises InvalidURL: no installed or known backend serves the scheme.
    :raises BackendNotInstalled: the scheme belongs to a taskmill backend that is not
        installed; the message names the pip package.
    """
    scheme = url_scheme(url)
    ep = _entry_point(scheme)
    if ep is None:
        if scheme in KNOWN_PACKAGES:
            package = KNOWN_PACKAGES[scheme]
            raise BackendNotInstalled(
                f"the {scheme}:// backend is not installed; install it with: pip install {package}"
            )
        raise InvalidURL(
            f"unknown storage URL scheme {scheme!r} in {url!r}; installed backends serve: "
            f"{', '.join(s + '://' for s in installed_schemes())}"
        )
    try:
        cls = ep.load()
    except ImportError as exc:
        package = KNOWN_PACKAGES.get(scheme, ep.value.split(":")[0].split(".")[0])
        raise BackendNotInstalled(
            f"the {scheme}:// backend failed to import ({exc}); reinstall it with: "
            f"pip install {package}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, TaskStorage)):
        raise InvalidURL(
            f"entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP} "
            "does not name a TaskStorage subclass"
        )
    return cls


def storage_for_url(url: str, **options: Any) -> TaskStorage:
    """Build (without connecting) the storage for ``url``."""
    return storage_class(url).from_url(url, **options)
