-- taskmill SQLite schema, version 6: tombstones of tasks deleted by their finish.
--
-- Applied to a version-5 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- A finish with Finish.delete (delete_completed, delete_failed: docs/retention.md)
-- deletes its task, the aliases it settled and their attempts, and first copies each
-- one's row here: its last snapshot, in the columns of `tasks` the snapshot reads
-- (rows.TASK_COLUMNS; a migration that adds one to `tasks` adds it here too).
-- read_events gives the events of a deleted task this snapshot (it joins here on the
-- task id when the task row is gone), deleted_task reads it by id, and prune_events
-- deletes the tombstones as old as the events it prunes.
--
-- n is the insertion order, so rows are appended (a finish copies rows in a batch; a
-- random-key table cost a third of delete mode's speed), and deleted_at, INTEGER
-- microseconds read under the writer lock, grows with n: prune_events deletes a
-- prefix by n, like the events. The id index serves the lookups.
CREATE TABLE IF NOT EXISTS tombstones (
    n                INTEGER PRIMARY KEY,
    deleted_at       INTEGER NOT NULL,
    seq              INTEGER NOT NULL,
    id               TEXT    NOT NULL,
    task_type        TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    created_at       INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    app_id           TEXT,
    params           TEXT    NOT NULL,
    data             TEXT    NOT NULL,
    priority         INTEGER NOT NULL,
    attempts         INTEGER NOT NULL,
    max_retries      INTEGER NOT NULL,
    result           TEXT,
    error            TEXT,
    progress_done    REAL    NOT NULL,
    progress_total   REAL,
    progress_message TEXT,
    dedupe_key       TEXT,
    alias_of         TEXT,
    parent_id        TEXT,
    user_id          TEXT,
    cancel_reason    TEXT,
    started_at       INTEGER,
    finished_at      INTEGER,
    worker_id        TEXT,
    lease_expires_at INTEGER
);

CREATE UNIQUE INDEX IF NOT EXISTS tombstones_id ON tombstones (id);
