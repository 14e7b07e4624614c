"""How an option is set without code, declared once on the option itself.

An option is an attrs field (of :class:`~taskmill.worker_options.WorkerOptions`, of
:class:`~taskmill.backoff.RetryPolicy`) whose metadata is :func:`settable`: a one-line
help and a :class:`TextForm`, which reads the value from the text a ``TASKMILL_*``
variable or a command-line flag holds and from a TOML value. Everything else follows
from the field's name by one spelling rule (:func:`variable_name`, :func:`flag_name`):
``lease_seconds`` is the keyword argument and file key ``lease_seconds``, the variable
``TASKMILL_LEASE_SECONDS`` and the flag ``--lease-seconds``. :func:`settings_of` lists
the settings of a class's options; :mod:`taskmill.settings` and the command line are
built from that list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Final

import attrs

SETTABLE: Final = "taskmill.settable"
"""The metadata key of a field's :class:`Settable`."""
PARTS: Final = "taskmill.settable_parts"
"""The metadata key of a field whose value is built from settable parts (:class:`Parts`)."""

HOST_APP: Final = "-"
"""How ``app_ids`` names the host's own tasks (``app_id`` None), as ``taskmill ls``
prints them."""


def _same(value: Any) -> Any:
    return value


@attrs.frozen
class TextForm:
    """How one setting is read from text (a variable, a flag) and from a TOML value,
    what it expects (for messages), and how its value becomes the option's."""

    expected: str
    """What it expects, as messages and docs say it ("a whole number, 1 or more")."""
    from_text: Callable[[str], Any]
    from_value: Callable[[object], Any]
    none: str | None = None
    """The word that means None ("auto", "off"), if any."""
    many: bool = False
    """A list: comma-separated in text, an array in a file; a flag may be repeated."""
    switch: bool = False
    """True or false: the flag alone means true (``--delete-completed``), and also takes
    a value (``--delete-completed false``)."""
    to_option: Callable[[Any], Any] = _same
    """The setting's value as the option takes it (seconds as a ``timedelta``)."""
    from_option: Callable[[Any], Any] = _same
    """The option's value as the setting holds it (the inverse of ``to_option``)."""

    def show(self, value: Any) -> str:
        """``value`` as ``taskmill config`` and ``--help`` show it."""
        if value is None:
            return self.none or ("all" if self.many else "-")
        if isinstance(value, tuple):
            return ", ".join(HOST_APP if v is None else str(v) for v in value) or "(none)"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


@attrs.frozen
class Settable:
    """What makes an option settable without code (the metadata :func:`settable` puts
    on its field)."""

    help: str
    """One line: what the setting does (``taskmill config``, ``--help``, the docs)."""
    form: TextForm
    metavar: str = "VALUE"
    """What the flag's value is called in ``--help`` (``N``, ``SECONDS``)."""
    aliases: tuple[str, ...] = ()
    """Older spellings of the flag, still accepted (``--lease`` for ``--lease-seconds``)."""


@attrs.frozen
class Parts:
    """A field whose value (a :class:`~taskmill.backoff.RetryPolicy`) is built from the
    settable fields of ``cls``, each a setting named ``prefix`` + the field's name."""

    cls: type
    prefix: str


def settable(
    help: str, form: TextForm, metavar: str = "VALUE", *, aliases: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The metadata that makes an attrs field a setting (``attrs.field(...,
    metadata=settable("tasks run at once", whole(1), "N"))``)."""
    return {SETTABLE: Settable(help, form, metavar, aliases)}


def settable_parts(cls: type, prefix: str) -> dict[str, Any]:
    """The metadata of a field built from the settable fields of ``cls`` (see
    :class:`Parts`)."""
    return {PARTS: Parts(cls, prefix)}


def variable_name(name: str) -> str:
    """The environment variable of setting ``name``: ``TASKMILL_`` and the name in
    capitals."""
    return f"TASKMILL_{name.upper()}"


def flag_name(name: str) -> str:
    """The command-line flag of setting ``name``: its words joined with dashes."""
    return "--" + name.replace("_", "-")


# -- the settings of a class's options ------------------------------------------------


@attrs.frozen
class Setting:
    """One setting of an option, derived from the option's field (see
    :func:`settings_of`)."""

    name: str
    """The setting's name and file key (``lease_seconds``, ``retry_base``)."""
    option: str
    """The field (keyword argument) of the options it sets."""
    declared: Settable
    default: Any
    """The option's default, as the setting holds it (seconds for a ``timedelta``)."""
    part: str | None = None
    """With a :class:`Parts` option: the field of its value this sets (``base``)."""
    part_of: type | None = None


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings of ``cls``'s options, in field order: one per :func:`settable`
    field, one per settable field of a :func:`settable_parts` field's class. Fields
    with neither are set in code only."""
    return tuple(_settings_of(cls))


def _settings_of(cls: type) -> Iterator[Setting]:
    for field in attrs.fields(cls):
        if SETTABLE in field.metadata:
            declared: Settable = field.metadata[SETTABLE]
            default = declared.form.from_option(field.default)
            yield Setting(field.name, field.name, declared, default)
        elif PARTS in field.metadata:
            parts: Parts = field.metadata[PARTS]
            for part in settings_of(parts.cls):
                yield Setting(
                    parts.prefix + part.name,
                    field.name,
                    part.declared,
                    part.default,
                    part=part.name,
                    part_of=parts.cls,
                )


def option_values(settings: tuple[Setting, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """The options that ``values`` (by setting name) give, as keyword arguments of the
    options' class: each converted (``to_option``), the parts of one option built
    into its value (``RetryPolicy(base=..., ...)``)."""
    options: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    builders: dict[str, type] = {}
    for setting in settings:
        value = setting.declared.form.to_option(values[setting.name])
        if setting.part is None or setting.part_of is None:
            options[setting.option] = value
        else:
            parts.setdefault(setting.option, {})[setting.part] = value
            builders[setting.option] = setting.part_of
    for option, kwargs in parts.items():
        options[option] = builders[option](**kwargs)
    return options


# -- text forms -------------------------------------------------------------------------


_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_seconds(text: str) -> float:
    """Seconds from ``"90"``, ``"1.5"``, ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"`` or
    ``"2w"``.

    :raises ValueError: anything else, or a value that is not finite.
    """
    text = text.strip()
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].isalpha() else (text, "s")
    if unit not in _UNITS:
        raise ValueError(text)
    value = float(number) * _UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _number_value(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(value)
    return float(value)


def _number(minimum: float, *, exclusive: bool, seconds: bool) -> TextForm:
    """A finite number above ``minimum``; with ``seconds``, units are allowed too."""
    bound = f"more than {minimum:g}" if exclusive else f"{minimum:g} or more"
    parse = parse_seconds if seconds else float

    def check(value: float) -> float:
        if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
            raise ValueError(value)
        return value

    def from_value(value: object) -> float:
        if isinstance(value, str):
            return check(parse(value))
        return check(_number_value(value))

    expected = (
        f"a number of seconds, {bound} (or with a unit: 90s, 5m, 2h, 1d)"
        if seconds
        else f"a number, {bound}"
    )
    return TextForm(
        expected=expected, from_text=lambda text: check(parse(text)), from_value=from_value
    )


def number(minimum: float, *, exclusive: bool) -> TextForm:
    """A finite number, ``minimum`` or more (``exclusive``: more than ``minimum``)."""
    return _number(minimum, exclusive=exclusive, seconds=False)


def seconds(minimum: float, *, exclusive: bool) -> TextForm:
    """Seconds, as :func:`number` or with a unit (``90s``, ``5m``, ``2h``, ``1d``)."""
    return _number(minimum, exclusive=exclusive, seconds=True)


def duration(minimum: float, *, exclusive: bool) -> TextForm:
    """Seconds, as :func:`seconds`, for an option that takes a ``timedelta``."""
    return attrs.evolve(
        seconds(minimum, exclusive=exclusive),
        to_option=lambda value: timedelta(seconds=value),
        from_option=lambda value: value.total_seconds(),
    )


def whole(minimum: int) -> TextForm:
    """A whole number, ``minimum`` or more."""

    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(value)
        return value

    def from_value(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(value)
        return check(value)

    return TextForm(
        expected=f"a whole number, {minimum} or more",
        from_text=lambda text: check(int(text.strip())),
        from_value=from_value,
    )


def fraction() -> TextForm:
    """A number from 0 to 1."""

    def check(value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(value)
        return value

    return TextForm(
        expected="a number from 0 to 1",
        from_text=lambda text: check(float(text)),
        from_value=lambda value: check(_number_value(value)),
    )


def optional(form: TextForm, word: str) -> TextForm:
    """``form``, or None spelled ``word`` (and, in a file, ``false``)."""

    def from_text(text: str) -> Any:
        return None if text.strip().lower() == word else form.from_text(text)

    def from_value(value: object) -> Any:
        if value is False or (isinstance(value, str) and value.strip().lower() == word):
            return None
        return form.from_value(value)

    return attrs.evolve(
        form,
        expected=f"{form.expected}, or {word!r}",
        from_text=from_text,
        from_value=from_value,
        none=word,
        to_option=lambda value: None if value is None else form.to_option(value),
        from_option=lambda value: None if value is None else form.from_option(value),
    )


def names(*, host: bool = False) -> TextForm:
    """A list of names, without repeats; with ``host``, :data:`HOST_APP` is None."""

    def clean(items: list[str]) -> tuple[Any, ...]:
        found = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
        return tuple(None if host and n == HOST_APP else n for n in found)

    def from_value(value: object) -> tuple[Any, ...]:
        if isinstance(value, str):
            return clean(value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return clean(value)
        raise ValueError(value)

    suffix = f" ({HOST_APP!r} for the host's own tasks)" if host else ""
    return TextForm(
        expected=f"a list of names{suffix}: comma-separated in a variable, an array in a file",
        from_text=lambda text: clean(text.split(",")),
        from_value=from_value,
        many=True,
    )


def choice(choices: tuple[str, ...], *, upper: bool = False) -> TextForm:
    """One of ``choices`` (any case; kept in capitals with ``upper``)."""

    def pick(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in choices:
            raise ValueError(text)
        return value

    def from_value(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(value)
        return pick(value)

    return TextForm(expected=f"one of {', '.join(choices)}", from_text=pick, from_value=from_value)


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def boolean() -> TextForm:
    """True or false (also 1/0, yes/no, on/off in text)."""

    def from_text(text: str) -> bool:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(text)

    def from_value(value: object) -> bool:
        if not isinstance(value, bool):
            raise ValueError(value)
        return value

    return TextForm(
        expected="true or false (1/0, yes/no, on/off)",
        from_text=from_text,
        from_value=from_value,
        switch=True,
    )


def text() -> TextForm:
    """A non-empty string, without surrounding spaces."""

    def from_text(text: str) -> str:
        if not text.strip():
            raise ValueError(text)
        return text.strip()

    def from_value(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(value)
        return from_text(value)

    return TextForm(expected="a non-empty string", from_text=from_text, from_value=from_value)
