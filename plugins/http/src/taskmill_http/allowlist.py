"""The handler-host allow-list: where a handler registered over HTTP may make a worker
send its ``POST``.

Any app token may register a handler (``PUT /v1/handlers/{task_type}``), and every worker
then POSTs that app's tasks to the URL it gave. Without a bound, an app could make the
workers POST to internal addresses (a cloud metadata endpoint, a database's HTTP port,
another tenant's sidecar). :class:`HandlerHosts` is that bound, set by the
``handler_hosts`` setting (:mod:`taskmill_http.settings`); its default is the loopback
host only (:data:`DEFAULT_HANDLER_HOSTS`).

An entry is one of:

- a host name, matched exactly (``localhost``, ``thumbs.internal``), or a suffix
  wildcard ``*.example.com`` (any name ending in ``.example.com``, not the name
  itself). A name on the list is trusted as a name: the operator's DNS says where it
  points;
- an IP address (``::1``, ``10.1.2.3``) or a CIDR network (``127.0.0.0/8``,
  ``fd00::/8``);
- ``*`` alone: any host (the list is off; for a service whose tokens are all trusted).

A URL is allowed when its host is an IP address inside a listed network, or a name on
the list, or another name **every** address of which (as the resolver answers now) is
inside a listed network. The last case is checked at every call, not once: a name may
resolve to an allowed address when it is registered and to a forbidden one later (DNS
rebinding), so the worker resolves it, checks every address, and connects to an address
it checked (:meth:`HandlerHosts.route`), never letting the HTTP client resolve the name
again. An IPv4 address written as IPv6 (``::ffff:169.254.169.254``) is checked as the
IPv4 address it is.

This module imports only the standard library: a worker imports it at start.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import attrs

__all__ = [
    "ANY_HOST",
    "CHANGE_HINT",
    "DEFAULT_HANDLER_HOSTS",
    "HandlerHosts",
    "HostNotAllowed",
    "Resolver",
    "Route",
    "system_resolver",
]

DEFAULT_HANDLER_HOSTS: Final[tuple[str, ...]] = ("127.0.0.0/8", "::1", "localhost")
"""Loopback only: a handler's receiver runs on the worker's own machine."""
ANY_HOST: Final = "*"
"""The entry that allows any host."""
CHANGE_HINT: Final = (
    "taskmill serve --handler-hosts, $TASKMILL_HANDLER_HOSTS, or handler_hosts in the"
    " [service] table of the tokens file; a worker process reads $TASKMILL_HANDLER_HOSTS;"
    " docs/service.md, 'Handler hosts'"
)
"""Where the setting is changed, as refusals say."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves ``(host, port)`` to the IP addresses (as text) a connection may go to."""

_LABEL: Final = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_LAST_LABEL: Final = r"[A-Za-z_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NAME_RE: Final = re.compile(rf"(?:{_LABEL}\.)*{_LAST_LABEL}")
"""A host name: labels of letters, digits, ``-`` and ``_``, the last not starting with
a digit (so that ``300.1.1.1`` is a bad address, not a name)."""


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives for ``host`` (TCP), in its order,
    without repeats.

    :raises OSError: it cannot resolve the name.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class HostNotAllowed(ValueError):
    """A handler URL whose host the allow-list does not admit (the message says which
    host, which addresses, and which setting to change)."""


@attrs.frozen
class Route:
    """Where a request to an allowed URL goes."""

    host: str
    """The URL's host, as the request names it (``Host`` header, TLS server name)."""
    addresses: tuple[str, ...] = ()
    """The checked addresses to connect to, in order; empty: connect to ``host`` as
    it is (an IP address, or a name the list trusts)."""


def _address(text: str) -> IPAddress | None:
    """``text`` as an IP address (a scope id ``%eth0`` dropped), or None."""
    try:
        found = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def _entry_error(entry: str, why: str) -> ValueError:
    return ValueError(
        f"handler_hosts entry {entry!r} {why}; an entry is a host name (localhost), a"
        " *.suffix wildcard (*.example.com), an IP address (::1), a CIDR network"
        " (127.0.0.0/8), or * alone for any host"
    )


class HandlerHosts:
    """The hosts handler URLs may name (see the module docstring).

    :param entries: the list (default: :data:`DEFAULT_HANDLER_HOSTS`).
    :param source: where the list came from, for messages (``--handler-hosts``,
        ``TASKMILL_HANDLER_HOSTS``, ...).
    :param resolver: resolves names that are not on the list (default: the system's).
    :raises ValueError: an entry is none of the kinds above.
    """

    def __init__(
        self,
        entries: Iterable[str] = DEFAULT_HANDLER_HOSTS,
        *,
        source: str = "the default",
        resolver: Resolver | None = None,
    ) -> None:
        self.entries = tuple(dict.fromkeys(e.strip() for e in entries if e.strip()))
        self.source = source
        self.resolver: Resolver = resolver or system_resolver
        self.any_host = False
        self._names: set[str] = set()
        self._suffixes: list[str] = []
        self._networks: list[IPNetwork] = []
        for entry in self.entries:
            self._add(entry)

    def _add(self, entry: str) -> None:
        if entry == ANY_HOST:
            self.any_host = True
            return
        if entry.startswith("*."):
            name = entry[2:].rstrip(".").lower()
            if not _NAME_RE.fullmatch(name):
                raise _entry_error(entry, "is not a *.suffix wildcard of a host name")
            self._suffixes.append("." + name)
            return
        if any(c in entry for c in ":/") or _address(entry) is not None:
            try:
                network = ipaddress.ip_network(entry, strict=True)
            except ValueError as exc:
                raise _entry_error(entry, f"is not an IP address or network ({exc})") from None
            self._networks.append(network)
            return
        name = entry.rstrip(".").lower()
        if not _NAME_RE.fullmatch(name):
            raise _entry_error(entry, "is not a host name")
        self._names.add(name)

    def __repr__(self) -> str:
        return f"HandlerHosts({list(self.entries)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HandlerHosts):
            return NotImplemented
        return (self.entries, self.resolver) == (other.entries, other.resolver)

    def __hash__(self) -> int:
        return hash(self.entries)

    # -- the checks --------------------------------------------------------------------

    def allows_name(self, name: str) -> bool:
        """Whether host name ``name`` is on the list (exactly, or by a wildcard)."""
        name = name.rstrip(".").lower()
        return self.any_host or name in self._names or name.endswith(tuple(self._suffixes))

    def allows_address(self, address: str | IPAddress) -> bool:
        """Whether IP ``address`` is inside a listed network."""
        if self.any_host:
            return True
        found = _address(address) if isinstance(address, str) else address
        if found is None:
            return False
        if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
            found = found.ipv4_mapped
        return any(found in network for network in self._networks)

    def refusal(self, what: str) -> HostNotAllowed:
        """The error that names the refused ``what``, the list and how to change it."""
        listed = ", ".join(self.entries) or "nothing"
        return HostNotAllowed(
            f"{what}: not allowed by the handler-host allow-list (handler_hosts from"
            f" {self.source}: {listed}); to allow it, add the host or its network to"
            f" handler_hosts ({CHANGE_HINT})"
        )

    async def route(self, host: str, port: int) -> Route:
        """Where a request to ``host:port`` may go (``host`` a URL's host, without the
        brackets of an IPv6 address).

        :raises HostNotAllowed: ``host`` is an address outside every listed network, or
            a name off the list that resolves to such an address.
        :raises OSError: ``host`` is a name off the list that does not resolve now.
        """
        if self.any_host:
            return Route(host)
        address = _address(host)
        if address is not None:
            if not self.allows_address(address):
                raise self.refusal(f"the handler URL's host {host}")
            return Route(host)
        if self.allows_name(host):
            return Route(host)
        addresses = await self.resolver(host, port)
        outside = [a for a in addresses if not self.allows_address(a)]
        if outside or not addresses:
            shown = ", ".join(outside) or "no address"
            raise self.refusal(f"the handler URL's host {host!r} resolves to {shown}")
        return Route(host, tuple(addresses))
