-- taskmill SQLite schema, version 6: tombstones of tasks deleted by their finish.
--
-- Applied to a version-5 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- A finish with Finish.delete (delete_completed, delete_failed: docs/retention.md)
-- deletes its task, the aliases it settled and their attempts, and writes here each
-- one's last snapshot: its columns (rows.TASK_COLUMNS, in that order) as one JSON
-- array. read_events gives the events of a deleted task this snapshot (it joins here
-- on the task id when the task row is gone), deleted_task reads it by id, and
-- prune_events deletes the tombstones as old as the events it prunes (deleted_at:
-- INTEGER microseconds, the index that prune walks). Nothing else reads this table.
CREATE TABLE IF NOT EXISTS tombstones (
    id         TEXT    NOT NULL PRIMARY KEY,
    deleted_at INTEGER NOT NULL,
    task       TEXT    NOT NULL
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS tombstones_age ON tombstones (deleted_at);
