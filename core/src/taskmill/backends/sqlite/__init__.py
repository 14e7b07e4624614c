"""``sqlite:///path`` — the embedded default backend (stdlib :mod:`sqlite3`).

See :mod:`taskmill.backends.sqlite.storage` for its design and guarantees and
:mod:`taskmill.backends.sqlite.schema` for the versioned migrations.
"""

from taskmill.backends.sqlite.schema import latest_version
from taskmill.backends.sqlite.storage import SQLiteStorage, claim_statement

__all__ = ["SQLiteStorage", "claim_statement", "latest_version"]
