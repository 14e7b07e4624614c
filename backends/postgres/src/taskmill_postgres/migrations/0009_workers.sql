-- taskmill PostgreSQL schema, version 9: the worker registry (docs/workers.md).
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 9.

-- One row per registered worker (workers.py): its record (the core's JSON text,
-- taskmill.workers.WorkerRecord, opaque here and kept byte for byte) and its last
-- heartbeat (the database clock, now(), written by put_worker). A handful of rows: no
-- index but the key.
CREATE TABLE IF NOT EXISTS workers (
    id           text COLLATE "C" PRIMARY KEY,
    heartbeat_at timestamptz      NOT NULL,
    record       text             NOT NULL
);
