"""Bearer tokens: who a caller is, from its credentials alone.

The tokens file is TOML with one table, ``[tokens]``, mapping each token to the app it
acts for, or to ``"*"`` for an admin (every app)::

    [tokens]
    "s3cret-photos" = "photos"
    "s3cret-ops" = "*"

Lookups hash the presented token first and compare digests with
:func:`hmac.compare_digest`, so the time a lookup takes does not depend on how much of a
real token a guess shares. Tokens never appear in a ``repr``, a log line or an error.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

import attrs
from taskmill.errors import ConfigurationError

ADMIN = "*"
"""The app a token maps to when it may act for every app."""
TOKENS_ENV = "TASKMILL_TOKENS_FILE"
"""Names the tokens file when ``taskmill serve`` gets no ``--tokens``."""

SESSION_SECRET_ENV = "TASKMILL_SESSION_SECRET"
"""Read by ``taskmill serve``: the key that signs the dashboard's session cookies (share
it between replicas; without it each process makes a random one, and sessions end with
it). Here, with the tokens, so that the command line names it without importing the
dashboard."""


@attrs.frozen
class Caller:
    """An authenticated caller: the app it acts for, or every app (admin)."""

    app_id: str | None
    """Its app; None for an admin token."""

    @property
    def is_admin(self) -> bool:
        """True for an admin token (``"*"``): it sees and touches every app's tasks."""
        return self.app_id is None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Tokens:
    """The tokens a service accepts, each mapped to an app id or to ``"*"`` (admin).

    :raises ConfigurationError: a token or an app id is empty or not a string.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._callers: dict[bytes, Caller] = {}
        for token, app_id in tokens.items():
            if not isinstance(token, str) or not token:
                raise ConfigurationError("a token must be a non-empty string")
            if not isinstance(app_id, str) or not app_id:
                raise ConfigurationError(
                    'each token maps to an app id (a non-empty string) or to "*" (admin)'
                )
            self._callers[_digest(token)] = Caller(None if app_id == ADMIN else app_id)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokens:
        """Read a tokens file (see the module docstring).

        :raises ConfigurationError: the file is missing, is not TOML, or has no
            ``[tokens]`` table of strings; the message names the file, never a token.
        """
        where = Path(path)
        try:
            document = tomllib.loads(where.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the tokens file {where}: {exc.strerror}"
            ) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"the tokens file {where} is not TOML: {exc}") from None
        table = document.get("tokens")
        if not isinstance(table, dict):
            raise ConfigurationError(
                f'the tokens file {where} needs a [tokens] table: "token" = "app_id" (or "*")'
            )
        try:
            return cls(table)
        except ConfigurationError as exc:
            raise ConfigurationError(f"the tokens file {where}: {exc}") from None

    def caller(self, token: str) -> Caller | None:
        """The caller ``token`` identifies, or None for an unknown token."""
        return self._lookup(_digest(token))

    def _lookup(self, presented: bytes) -> Caller | None:
        # Every digest is compared, so the time taken says nothing of which matched.
        found: Caller | None = None
        for digest, caller in self._callers.items():
            if hmac.compare_digest(digest, presented):
                found = caller
        return found

    def fingerprint(self, token: str) -> str | None:
        """What a dashboard session keeps instead of ``token``: a digest that names the
        token without revealing it, or None for an unknown token."""
        if self.caller(token) is None:
            return None
        return _digest(token).hex()

    def caller_by_fingerprint(self, fingerprint: str) -> Caller | None:
        """The caller of the token whose :meth:`fingerprint` this is, or None (an
        unknown or malformed fingerprint: the token was removed, or never existed)."""
        try:
            return self._lookup(bytes.fromhex(fingerprint))
        except ValueError:
            return None

    @property
    def apps(self) -> list[str]:
        """The apps that have a token, by name (the apps whose charts someone may read:
        the metrics collector samples their queue depth)."""
        return sorted({c.app_id for c in self._callers.values() if c.app_id is not None})

    def __len__(self) -> int:
        return len(self._callers)

    def __repr__(self) -> str:
        return f"Tokens({len(self._callers)} tokens)"
