"""Capability marks: a contract test that needs what some stores lack says so.

``@requires("shared_between_processes")`` on a test of the suite makes it run only on a
store whose :class:`~taskmill.storage.StorageCapabilities` has that flag set; on any
other store it is skipped with a reason naming the store and the capability, so a
backend's gaps are visible in every test report and never silent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from taskmill.storage import StorageCapabilities, TaskStorage

__all__ = ["CAPABILITIES", "missing_capabilities", "required_capabilities", "requires"]

F = TypeVar("F", bound=Callable[..., Any])

CAPABILITIES: tuple[str, ...] = tuple(f.name for f in attrs.fields(StorageCapabilities))
"""Every capability name a test may require (the fields of ``StorageCapabilities``)."""

_ATTRIBUTE = "__taskmill_requires__"


def requires(*capabilities: str) -> Callable[[F], F]:
    """Mark a contract test as needing every one of ``capabilities``.

    :raises ValueError: a name is not a field of ``StorageCapabilities`` (a typo would
        otherwise make a test run, or skip, where it should not).
    """
    unknown = [name for name in capabilities if name not in CAPABILITIES]
    if unknown or not capabilities:
        raise ValueError(
            f"unknown capability {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(CAPABILITIES)}"
        )

    def mark(test: F) -> F:
        setattr(test, _ATTRIBUTE, (*required_capabilities(test), *capabilities))
        return test

    return mark


def required_capabilities(test: object) -> tuple[str, ...]:
    """The capabilities ``test`` was marked with (empty when none)."""
    found: tuple[str, ...] = getattr(test, _ATTRIBUTE, ())
    return found


def missing_capabilities(storage: TaskStorage, test: object) -> str | None:
    """Why ``test`` cannot run on ``storage``, or None when the store has all it needs."""
    lacking = [
        name for name in required_capabilities(test) if name in storage.capabilities.lacking()
    ]
    if not lacking:
        return None
    return (
        f"{type(storage).__name__} declares it lacks "
        f"{' and '.join(lacking)} (StorageCapabilities), which this test needs"
    )
