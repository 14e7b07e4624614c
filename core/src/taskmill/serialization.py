"""The one converter that owns serialization: JSON-ready dicts of the model and back.

Datetimes become ISO-8601 strings with their UTC offset (and must come back tz-aware),
enums are stored by value, UUIDs as strings. Serialization is a concern of the edges —
the CLI, JSON documents in backends, payloads sent between processes — never of the
model itself.
"""

from __future__ import annotations

import functools
import json
import json.scanner
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

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


if TYPE_CHECKING:
    import cattrs

    converter: cattrs.Converter
    """The converter :func:`to_dict` and :func:`from_dict` use (made on first use)."""


def make_converter() -> cattrs.Converter:
    """A cattrs converter with taskmill's hooks (datetime, UUID; enums by value)."""
    import cattrs  # here: 60 ms of import that a worker's start does not need

    converter = cattrs.Converter()
    converter.register_unstructure_hook(datetime, _unstructure_datetime)
    converter.register_structure_hook(datetime, _structure_datetime)
    converter.register_unstructure_hook(uuid.UUID, str)
    converter.register_structure_hook(uuid.UUID, lambda v, _: uuid.UUID(str(v)))
    return converter


@functools.cache
def _converter() -> cattrs.Converter:
    return make_converter()


def __getattr__(name: str) -> Any:
    # ``converter`` is made on first use: cattrs costs 60 ms of import, which a worker's
    # start (and every CLI command that prints no JSON) does not need.
    if name == "converter":
        return _converter()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_dict(value: Any) -> dict[str, Any]:
    """A JSON-ready dict of a model object (Task, Attempt, ...)."""
    result = _converter().unstructure(value)
    assert isinstance(result, dict)
    return result


def from_dict(cls: type[T], value: dict[str, Any]) -> T:
    """The model object of ``cls`` that ``to_dict`` produced."""
    return _converter().structure(value, cls)


# One encoder: json.dumps builds a new one on every call with non-default options.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_make_c_encoder: Final[Callable[..., Callable[[Any, int], Any]] | None] = getattr(
    json.encoder, "c_make_encoder", None
)


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
_FLAT_MAX: Final = 8
# The C encoder of dumps without a circular-reference memo (markers None): for a dict
# whose values are all scalars, which cannot hold a reference to a container. It keeps no
# state, so one serves every call and thread.
_encode_flat: Final = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)


def dumps(value: JSON) -> str:
    """Compact JSON text; rejects NaN/Infinity and anything not JSON.

    :raises TypeError, ValueError: the value is not JSON-serializable.
    """
    if _make_c_encoder is None:
        return _ENCODER.encode(value)
    if _encode_flat is not None and type(value) is dict and len(value) <= _FLAT_MAX:
        # The common task params: a few scalars (exact types: no Python code runs while
        # encoding them). Without a memo to make and fill, the same text or error.
        for one in value.values():
            if type(one) not in _SCALARS:
                break
        else:
            return "".join(_encode_flat(value, 0))
    # What _ENCODER.encode does, without its two Python frames: a C encoder with a
    # fresh circular-reference memo (the same options), called directly.
    encode = _make_c_encoder(
        {}, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    return "".join(encode(value, 0))


_DECODER: Final = json.JSONDecoder()
_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    _DECODER  # type: ignore[arg-type]  # typeshed types the C scanner as a class
)


def loads(text: str) -> JSON:
    """Parse JSON text produced by :func:`dumps`; the same values and errors as
    ``json.loads``.

    This is on every path that reads a task, so it calls the decoder's (C) scanner
    directly: ``JSONDecoder.decode`` adds two Python frames and two regex matches for
    leading and trailing whitespace, which :func:`dumps` never writes (four times the
    scan of a small params object). Text the scanner does not take whole (whitespace
    around the value, an error) goes through ``decode``, for its result or its error.

    :raises json.JSONDecodeError: the text is not one JSON value.
    """
    try:
        value, end = _scan(text, 0)
    except StopIteration:  # no value at position 0: whitespace first, or not JSON
        return _DECODER.decode(text)
    if end != len(text):
        return _DECODER.decode(text)
    return value


MAX_PARAMS_DEPTH: Final = 100
"""How many levels of objects and lists task params may nest (the params object is
level 1). Deeper values encode, but JSON decoders hit their recursion limit reading them
back (and MongoDB refuses documents nested deeper than 100): they are refused."""


def _depth(value: Any) -> int:
    """How deeply ``value`` nests dicts and lists (iteratively: no recursion limit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_PARAMS_DEPTH:
            return level
        stack.extend((child, level + 1) for child in children)
    return deepest


def encode_params(params: Any, *, max_bytes: int, limit_of: str = "max_params_bytes") -> str:
    """Validate task parameters and return their JSON text.

    :raises InvalidParams: params is not a JSON object, holds a value JSON cannot
        represent (or a lone surrogate), nests deeper than :data:`MAX_PARAMS_DEPTH`,
        or is larger than ``max_bytes`` once encoded.
    """
    if not isinstance(params, dict):
        raise InvalidParams(
            f"task params must be a dict (a JSON object), not {type(params).__name__}"
        )
    try:
        text = dumps(params)
    except RecursionError:
        raise InvalidParams(
            "task params are nested too deeply to encode as JSON; flatten them"
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidParams(
            f"task params must be JSON-serializable: {exc}. Pass plain dicts, lists, "
            "strings, numbers, booleans and None (convert datetimes, sets, objects first)"
        ) from None
    if (
        len(text) > MAX_PARAMS_DEPTH  # else fewer braces and brackets than that
        and text.count("{") + text.count("[") > MAX_PARAMS_DEPTH
        and _depth(params) > MAX_PARAMS_DEPTH
    ):
        raise InvalidParams(
            f"task params nest more than {MAX_PARAMS_DEPTH} levels of objects and lists "
            "(a stored task must be readable by every backend and JSON decoder); flatten them"
        )
    try:
        size = len(text) if text.isascii() else len(text.encode())  # ASCII: a byte each
    except UnicodeEncodeError as exc:
        raise InvalidParams(
            f"task params must be valid Unicode text: {exc.object[exc.start : exc.end]!r} "
            f"at position {exc.start} of their JSON is a lone surrogate (half of a UTF-16 "
            "pair); pass text decoded properly, or bytes as base64 strings"
        ) from None
    if size > max_bytes:
        raise InvalidParams(
            f"task params are {size} bytes as JSON, over the limit of {max_bytes} bytes"
            f" ({limit_of}); store large inputs elsewhere and pass a reference"
            + (", or raise max_params_bytes" if limit_of == "max_params_bytes" else "")
        )
    return text


def is_finite_number(value: float) -> bool:
    """True for a number JSON can carry (not NaN or infinite)."""
    return not (math.isnan(value) or math.isinf(value))
