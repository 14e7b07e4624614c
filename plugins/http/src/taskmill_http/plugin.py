"""The taskmill plugin of taskmill-http (entry point ``http`` in ``taskmill.plugins``)."""

from __future__ import annotations


class HttpPlugin:
    """The hooks taskmill-http implements."""


plugin = HttpPlugin()
"""The object the ``taskmill.plugins`` entry point names."""
