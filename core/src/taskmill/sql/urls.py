"""Storage URLs: options checked against a documented list, and password redaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from taskmill.errors import InvalidURL

__all__ = ["check_known_options", "number_option", "redact"]


def redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = netloc[0].split(":", 1)[0] + ":***"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc[1]}"))


def check_known_options(
    scheme: str, given: Mapping[str, Any], valid: Mapping[str, str], *, also: str = ""
) -> None:
    """Refuse options of ``given`` that ``valid`` (name → what it means) does not list.

    :param also: appended to the message (what else the URL may hold).
    :raises InvalidURL: an unknown option; the message lists the valid ones.
    """
    unknown = sorted(set(given) - set(valid))
    if unknown:
        listed = "; ".join(f"{name}: {doc}" for name, doc in valid.items())
        raise InvalidURL(
            f"unknown {scheme}:// option(s): {', '.join(unknown)}; valid options are: "
            f"{listed}{also}"
        )


def number_option(scheme: str, name: str, value: Any, *, minimum: float, integer: bool) -> float:
    """The option ``name`` as a number ``>= minimum`` (and below 1e9).

    :raises InvalidURL: it is not such a number (a bool is not a number here).
    """
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        number = minimum - 1
    if isinstance(value, bool) or not minimum <= number < 1e9:
        kind = "a whole number" if integer else "a number of seconds"
        raise InvalidURL(f"{scheme}:// option {name} must be {kind} >= {minimum:g}, got {value!r}")
    return number
