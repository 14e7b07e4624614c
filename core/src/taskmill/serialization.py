"""The one converter that owns serialization: JSON-ready dicts of the model and back.

Datetimes become ISO-8601 strings with their UTC offset (and must come back tz-aware),
enums are stored by value, UUIDs as strings. Serialization is a concern of the edges —
the CLI, JSON documents in backends, payloads sent between processes — never of the
model itself.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import cattrs

from taskmill.errors import InvalidParams
from taskmill.model import JSON

T = TypeVar("T")


def _unstructure_datetime(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _structure_datetime(value: Any, _: type) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    if parsed.utcoffset() is None:
        raise ValueError(f"datetime without a timezone: {value!r}")
    return parsed.astimezone(UTC)


def make_converter() -> cattrs.Converter:
    """A cattrs converter with taskmill's hooks (datetime, UUID; enums by value)."""
    converter = cattrs.Converter()
    converter.register_unstructure_hook(datetime, _unstructure_datetime)
    converter.register_structure_hook(datetime, _structure_datetime)
    converter.register_unstructure_hook(uuid.UUID, str)
    converter.register_structure_hook(uuid.UUID, lambda v, _: uuid.UUID(str(v)))
    return converter


converter = make_converter()


def to_dict(value: Any) -> dict[str, Any]:
    """A JSON-ready dict of a model object (Task, Attempt, ...)."""
    result = converter.unstructure(value)
    assert isinstance(result, dict)
    return result


def from_dict(cls: type[T], value: dict[str, Any]) -> T:
    """The model object of ``cls`` that ``to_dict`` produced."""
    return converter.structure(value, cls)


# One encoder: json.dumps builds a new one on every call with non-default options.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: JSON) -> str:
    """Compact JSON text; rejects NaN/Infinity and anything not JSON.

    :raises TypeError, ValueError: the value is not JSON-serializable.
    """
    return _ENCODER.encode(value)


loads: Final[Callable[[str], JSON]] = json.JSONDecoder().decode
"""Parse JSON text produced by :func:`dumps` (one decoder, called without the wrapper
of ``json.loads``: this is on every path that reads a task)."""


def encode_params(params: Any, *, max_bytes: int) -> str:
    """Validate task parameters and return their JSON text.

    :raises InvalidParams: params is not a JSON object, holds a value JSON cannot
        represent, or is larger than ``max_bytes`` once encoded.
    """
    if not isinstance(params, dict):
        raise InvalidParams(
            f"task params must be a dict (a JSON object), not {type(params).__name__}"
        )
    try:
        text = dumps(params)
    except (TypeError, ValueError) as exc:
        raise InvalidParams(
            f"task params must be JSON-serializable: {exc}. Pass plain dicts, lists, "
            "strings, numbers, booleans and None (convert datetimes, sets, objects first)"
        ) from None
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidParams(
            f"task params are {size} bytes as JSON, over the limit of {max_bytes} bytes; "
            "store large inputs elsewhere and pass a reference, or raise "
            "max_params_bytes"
        )
    return text


def is_finite_number(value: float) -> bool:
    """True for a number JSON can carry (not NaN or infinite)."""
    return not (math.isnan(value) or math.isinf(value))
