-- taskmill MySQL / MariaDB schema, version 2: task dependencies (`after=`,
-- docs/dependencies.md).
--
-- migrate() runs each statement in turn, as for 0001. MySQL 8 has no ADD COLUMN IF NOT
-- EXISTS: the runner skips an ADD COLUMN whose column exists, so a cut-short run is
-- simply run again.

-- How many of a task's dependencies have not ended yet.
ALTER TABLE tasks ADD COLUMN waiting_on INT NOT NULL DEFAULT 0;

-- A task waiting for dependencies is no claimable leader: it leaves the claim index's
-- queue (claim_type NULL) until its count reaches 0. The claim statement is unchanged.
ALTER TABLE tasks MODIFY claim_type VARCHAR(255) AS
    (IF(status = 'pending' AND alias_of IS NULL AND waiting_on = 0, task_type, NULL)) STORED;

-- One row per unresolved edge: `task_id` waits for `depends_on`; deleted when the
-- dependency ends, in that transaction. `always` is after_policy="always".
CREATE TABLE IF NOT EXISTS task_dependencies (
    depends_on VARCHAR(64) NOT NULL,
    task_id    VARCHAR(64) NOT NULL,
    always     BOOLEAN     NOT NULL,
    PRIMARY KEY (depends_on, task_id),
    KEY task_dependencies_dependent (task_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;
