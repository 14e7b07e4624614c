-- taskmill MySQL / MariaDB schema, version 5: the worker registry (docs/workers.md).
--
-- migrate() runs each statement in turn like 0001 and records schema_version = 5.

-- One row per registered worker: its record (the core's JSON text,
-- taskmill.workers.WorkerRecord, opaque here; up to 64 KiB, so MEDIUMTEXT: TEXT holds
-- 65,535 bytes) and its last heartbeat (the server clock, NOW(6), written by
-- put_worker). prune_workers() deletes by heartbeat_at; a handful of rows: no index but
-- the key.
CREATE TABLE IF NOT EXISTS workers (
    id           VARCHAR(255) NOT NULL PRIMARY KEY,
    heartbeat_at DATETIME(6)  NOT NULL,
    record       MEDIUMTEXT   NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;
