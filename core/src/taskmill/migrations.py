"""Versioned SQL migration files, for backends that keep a schema.

A backend ships ``NNNN_name.sql`` files in a ``migrations`` folder of its package,
numbered from 0001 without gaps; version N of its schema is what applying files 1..N in
order produces. This module finds and orders them; applying them (and recording the
version) is the backend's business, since only it knows its database.
"""

from __future__ import annotations

import re
from importlib.resources import files

import attrs

_FILE_NAME = re.compile(r"^(\d{4})_([A-Za-z0-9_]+)\.sql$")


@attrs.frozen
class Migration:
    """One migration file: the schema ``version`` it produces and its SQL text."""

    version: int
    name: str
    sql: str


def load_migrations(package: str, *, owner: str) -> tuple[Migration, ...]:
    """The migration files in ``package``'s ``migrations`` folder, in version order.

    :param owner: who ships them, named in the error (e.g. "taskmill-postgres").
    :raises RuntimeError: the files are not numbered 1..N without gaps (a packaging
        error, not a user error).
    """
    folder = files(package) / "migrations"
    found = [
        Migration(
            version=int(match.group(1)),
            name=entry.name,
            sql=entry.read_text(encoding="utf-8"),
        )
        for entry in folder.iterdir()
        if (match := _FILE_NAME.match(entry.name)) is not None
    ]
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(
            f"{owner} migrations must be numbered 0001, 0002, ... without gaps; "
            f"found {[m.name for m in found]}"
        )
    return tuple(found)
