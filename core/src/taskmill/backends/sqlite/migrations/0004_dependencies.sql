-- taskmill SQLite schema, version 4: task dependencies (`after=`, docs/dependencies.md).
--
-- Applied to a version-3 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- How many of a task's dependencies have not ended yet: the claim takes only tasks at
-- 0 (statements.CLAIMABLE), so the partial claim index still serves it.
ALTER TABLE tasks ADD COLUMN waiting_on INTEGER NOT NULL DEFAULT 0;

-- One row per unresolved edge: `task_id` waits for `depends_on`. A row is deleted when
-- its dependency ends (in that transaction), which settles the dependent; `always` is
-- after_policy="always" (1) or "completed" (0).
CREATE TABLE IF NOT EXISTS task_dependencies (
    depends_on TEXT    NOT NULL,
    task_id    TEXT    NOT NULL,
    always     INTEGER NOT NULL,
    PRIMARY KEY (depends_on, task_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS task_dependencies_dependent ON task_dependencies (task_id);
