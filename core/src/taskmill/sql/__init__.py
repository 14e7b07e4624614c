"""The toolkit SQL backends share; the core holds SQL text and helpers, never a driver.

- :mod:`taskmill.sql.rows`: task snapshots from rows, mapped by column name, once.
- :mod:`taskmill.sql.filters`: :class:`~taskmill.model.TaskFilter` translated per dialect.
- :mod:`taskmill.sql.lifecycle`: the ``SET`` / ``CASE`` clauses of the lifecycle kernel's
  transitions (:mod:`taskmill.lifecycle`).
- :mod:`taskmill.sql.urls`: URL options checked against a documented list, and password
  redaction.
- :mod:`taskmill.migrations`: the migration files and the one migration runner.
- :mod:`taskmill.cursors`: event-log positions written as the opaque, ordered cursor
  tokens of the storage contract (the memory store uses it too).

See docs/backends/toolkit.md ("The SQL toolkit") for how a backend uses them.
"""
