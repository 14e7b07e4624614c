"""``postgresql://`` (``postgres://``) — taskmill's PostgreSQL storage, on asyncpg.

Found by the core through the ``taskmill.backends`` entry points; nothing in the core
imports it. See :mod:`taskmill_postgres.storage` for its design and guarantees,
:mod:`taskmill_postgres.connection` for the pool and connection loss,
:mod:`taskmill_postgres.schema` for the versioned migrations and
:mod:`taskmill_postgres.listener` for LISTEN/NOTIFY change notifications.
"""

from taskmill_postgres.listener import PostgresChangeListener
from taskmill_postgres.schema import latest_version
from taskmill_postgres.statements import Statements
from taskmill_postgres.storage import PostgresStorage

__all__ = ["PostgresChangeListener", "PostgresStorage", "Statements", "latest_version"]
