-- taskmill SQLite schema, version 7: the worker registry (docs/workers.md).
--
-- Applied to a version-6 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- One row per registered worker: its record (the core's JSON text,
-- taskmill.workers.WorkerRecord, opaque here) and its last heartbeat (INTEGER
-- microseconds of the store clock, written by put_worker). A handful of rows: no index
-- but the key.
CREATE TABLE IF NOT EXISTS workers (
    id           TEXT    NOT NULL PRIMARY KEY,
    heartbeat_at INTEGER NOT NULL,
    record       TEXT    NOT NULL
) WITHOUT ROWID;
