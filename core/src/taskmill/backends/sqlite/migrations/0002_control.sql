-- taskmill SQLite schema, version 2: suspensions and the event log.
--
-- Applied to a version-1 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction; a fresh database gets 0001 and then this file.

-- Stored suspensions (SPEC 5.10). A NULL column means "any": (NULL, NULL) suspends
-- everything, (type, NULL) one task type of every app and of the host, (NULL, app) every
-- type of one app. A NULL maps to an empty BLOB in the unique index, which never equals
-- a TEXT value, so the host scope and an app or type named '' stay distinct.
-- Claims read this table inside their own transaction (see claim_statement).
CREATE TABLE IF NOT EXISTS suspensions (
    task_type  TEXT,
    app_id     TEXT,
    created_at INTEGER NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS suspensions_scope
    ON suspensions (ifnull(task_type, x''), ifnull(app_id, x''));

-- The event log (SPEC 5.11): one row per state change, written in the transaction that
-- makes the change. Every write runs inside BEGIN IMMEDIATE, so writers (of this and of
-- every other process) are serialised by SQLite and an AUTOINCREMENT seq assigned in a
-- later transaction is always larger than every seq already committed: cursors increase
-- in commit order, and a reader never finds a smaller seq appearing behind its cursor.
-- AUTOINCREMENT also keeps seqs from being reused after the newest events are pruned.
--
-- A row names its task by both the task's rowid (task_seq: the join is a rowid lookup)
-- and its id: task rowids are reused once the newest tasks are deleted by cleanup, so a
-- reader joins on both and skips events whose task is gone. Events are not deleted with
-- their tasks; prune_events removes them by age.
--
-- at is INTEGER microseconds, read inside the writer lock, so it is nondecreasing in
-- seq unless the wall clock steps back; prune_events relies on that to delete a prefix
-- of the log by seq (no index on at is kept on this hot path).
--
-- kind is an EventKind value and status a TaskStatus value. They carry no CHECK
-- constraint: only this backend writes them, and an IN-list CHECK costs more per row
-- than the rest of the insert (this table takes two rows per task on the claim/finish
-- path).
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_seq INTEGER NOT NULL,
    task_id  TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    status   TEXT    NOT NULL,
    at       INTEGER NOT NULL
);
