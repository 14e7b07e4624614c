"""The service's own settings, each declared once as a field of :class:`ServiceSettings`.

A field with :func:`taskmill.settable.settable` metadata is a setting, spelled as the
core's settings are (:mod:`taskmill.settable`): ``handler_hosts`` is the flag
``--handler-hosts`` of ``taskmill serve``, the variable ``TASKMILL_HANDLER_HOSTS`` and
the key ``handler_hosts`` of the ``[service]`` table of the tokens file (the one file
``taskmill serve`` reads; ``taskmill.toml`` holds the core's settings only and refuses
other keys). The first of these wins: the flag, the variable, the file, the default.

A worker process (``taskmill worker``, or any ``tm.worker()`` with taskmill-http
installed) reads no tokens file and has no such flag: it takes the variable, else the
default (:meth:`ServiceSettings.from_environment`).

This module imports no HTTP library: the command line and every worker import it.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
from taskmill.errors import ConfigurationError
from taskmill.settable import SETTABLE, Settable, flag_name, names, settable, variable_name

from taskmill_http.allowlist import DEFAULT_HANDLER_HOSTS, HandlerHosts

__all__ = ["SERVICE_TABLE", "ServiceSettings", "add_flags", "setting_names"]

SERVICE_TABLE: Final = "service"
"""The table of the tokens file that holds these settings."""
DEFAULT: Final = "the default"


@attrs.frozen
class ServiceSettings:
    """The settings of ``taskmill serve`` that are the service's own (see the module
    docstring for where each is read)."""

    handler_hosts: tuple[str, ...] = attrs.field(
        default=DEFAULT_HANDLER_HOSTS,
        metadata=settable(
            "hosts and networks that handlers registered over HTTP may POST to: host names"
            " (*.example.com wildcards), IP addresses, CIDR networks, or * for any host;"
            " default loopback only (127.0.0.0/8, ::1, localhost)",
            names(),
            "HOSTS",
        ),
    )
    sources: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    """Where each setting came from: a flag, a variable, the tokens file, the default."""

    def source(self, name: str) -> str:
        return self.sources.get(name, DEFAULT)

    def handler_host_list(self, **options: Any) -> HandlerHosts:
        """The allow-list ``handler_hosts`` sets (``options``: :class:`HandlerHosts`'s).

        :raises ConfigurationError: an entry is not a host, an address or a network.
        """
        try:
            return HandlerHosts(self.handler_hosts, source=self.source("handler_hosts"), **options)
        except ValueError as exc:
            raise ConfigurationError(
                f"{exc} (handler_hosts from {self.source('handler_hosts')})"
            ) from None

    @classmethod
    def load(
        cls,
        *,
        args: argparse.Namespace | None = None,
        tokens_file: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ServiceSettings:
        """The settings from the flags in ``args``, the variables of ``environ``
        (default ``os.environ``), the ``[service]`` table of ``tokens_file``, the
        defaults; the first of these that gives a setting wins.

        :raises ConfigurationError: a value cannot be read; the message names where it
            came from and what it expects.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if tokens_file is not None:
            for name, value in _file_table(Path(tokens_file)).items():
                values[name] = value
                sources[name] = f"{tokens_file} [{SERVICE_TABLE}]"
        for name, declared in _declared().items():
            variable = variable_name(name)
            text = environ.get(variable, "")
            if text.strip():
                values[name] = _parse(declared, text, f"{variable}={text!r}")
                sources[name] = variable
            flag = getattr(args, name, None) if args is not None else None
            if flag:
                joined = ",".join(flag) if isinstance(flag, list) else str(flag)
                values[name] = _parse(declared, joined, f"{flag_name(name)} {joined!r}")
                sources[name] = flag_name(name)
        return cls(**values, sources=sources)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ServiceSettings:
        """The settings a worker process has: its variables, else the defaults."""
        return cls.load(environ=environ)


def _declared() -> dict[str, Settable]:
    return {
        field.name: field.metadata[SETTABLE]
        for field in attrs.fields(ServiceSettings)
        if SETTABLE in field.metadata
    }


def setting_names() -> list[str]:
    """Every setting of :class:`ServiceSettings`, in declaration order."""
    return list(_declared())


def _parse(declared: Settable, text: str, where: str) -> Any:
    try:
        return declared.form.from_text(text)
    except (ValueError, IndexError):
        raise ConfigurationError(
            f"{where} is not valid: expected {declared.form.expected}"
        ) from None


def _file_table(path: Path) -> dict[str, Any]:
    """The settings of the ``[service]`` table of the tokens file ``path`` (none when it
    has no such table).

    :raises ConfigurationError: the table holds an unknown key or a bad value.
    """
    import tomllib

    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}  # Tokens.from_file says what is wrong with the file
    table = document.get(SERVICE_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: [{SERVICE_TABLE}] must be a table of settings")
    declared = _declared()
    found: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        if key not in declared:
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(
                f"{path} [{SERVICE_TABLE}]: unknown setting {raw_key!r}{hint}; the settings"
                f" are: {', '.join(declared)} (see docs/service.md)"
            )
        form = declared[key].form
        try:
            found[key] = form.from_value(value)
        except (ValueError, IndexError):
            raise ConfigurationError(
                f"{path} [{SERVICE_TABLE}]: {raw_key} = {value!r} is not valid: expected"
                f" {form.expected}"
            ) from None
    return found


def add_flags(command: Any) -> None:
    """Add a flag for each setting to ``command`` (an argparse parser)."""
    for name, declared in _declared().items():
        variable = variable_name(name)
        command.add_argument(
            flag_name(name),
            dest=name,
            action="append" if declared.form.many else "store",
            default=None,
            metavar=declared.metavar,
            help=f"{declared.help} (default: ${variable}, else [{SERVICE_TABLE}] {name} in"
            " the tokens file)",
        )
