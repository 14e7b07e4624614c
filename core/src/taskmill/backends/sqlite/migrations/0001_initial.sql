-- taskmill SQLite schema, version 1.
--
-- Timestamps are INTEGER microseconds since the Unix epoch (UTC). params, data and
-- result are JSON text. Enums are stored by value. Creation order is `seq`, the
-- table's rowid.
--
-- migrate() runs this file inside one BEGIN IMMEDIATE transaction and then records
-- schema_version = 1 in taskmill_meta; the IF NOT EXISTS clauses only make a re-run on
-- a database whose recorded version was lost harmless.

CREATE TABLE IF NOT EXISTS taskmill_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS tasks (
    seq              INTEGER PRIMARY KEY,
    id               TEXT    NOT NULL UNIQUE,
    task_type        TEXT    NOT NULL,
    status           TEXT    NOT NULL
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    created_at       INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    app_id           TEXT,
    params           TEXT    NOT NULL,
    data             TEXT    NOT NULL DEFAULT '{}',
    priority         INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_retries      INTEGER NOT NULL,
    result           TEXT,
    error            TEXT,
    progress_done    REAL    NOT NULL DEFAULT 0,
    progress_total   REAL,
    progress_message TEXT,
    dedupe_key       TEXT,
    alias_of         TEXT,
    parent_id        TEXT,
    user_id          TEXT,
    cancel_reason    TEXT
        CHECK (cancel_reason IN ('user', 'preempted', 'suspended', 'shutdown')),
    started_at       INTEGER,
    finished_at      INTEGER,
    worker_id        TEXT,
    lease_expires_at INTEGER
);

-- Claims: due PENDING leaders of one task type, by priority DESC then creation.
-- run_at and app_id are carried in the index so that the claim filters them without
-- visiting the table.
CREATE INDEX IF NOT EXISTS tasks_claim
    ON tasks (task_type, priority DESC, seq, run_at, app_id)
    WHERE status = 'pending' AND alias_of IS NULL;

-- Lease rescue: RUNNING tasks by lease expiry.
CREATE INDEX IF NOT EXISTS tasks_lease
    ON tasks (lease_expires_at)
    WHERE status = 'running';

-- Retention: terminal tasks (exactly those with finished_at set) by finish time.
CREATE INDEX IF NOT EXISTS tasks_finished
    ON tasks (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS tasks_parent
    ON tasks (parent_id)
    WHERE parent_id IS NOT NULL;

-- Settling aliases when their leader finishes.
CREATE INDEX IF NOT EXISTS tasks_alias
    ON tasks (alias_of)
    WHERE alias_of IS NOT NULL;

-- At most one active (PENDING or RUNNING) dedupe leader per (app_id, task_type, key).
-- A NULL app_id (the host) maps to an empty BLOB, which never equals any TEXT app id.
CREATE UNIQUE INDEX IF NOT EXISTS tasks_dedupe_leader
    ON tasks (ifnull(app_id, x''), task_type, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND alias_of IS NULL AND status IN ('pending', 'running');

-- The execution log: one row per finished attempt, read in id order. Rows are found by
-- task_seq (the task's rowid) rather than by the random UUID: attempts are written in
-- roughly task-creation order, so this index grows at its end instead of dirtying a
-- random page per row.
CREATE TABLE IF NOT EXISTS attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq    INTEGER NOT NULL,
    task_id     TEXT    NOT NULL,
    number      INTEGER NOT NULL,
    worker_id   TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    outcome     TEXT    NOT NULL
        CHECK (outcome IN ('completed', 'failed', 'timed_out', 'cancelled', 'lost',
                           'interrupted')),
    error       TEXT
);

CREATE INDEX IF NOT EXISTS attempts_task ON attempts (task_seq);
