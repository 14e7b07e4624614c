-- taskmill MySQL / MariaDB schema, version 4: tombstones of the tasks deleted by their
-- finish (delete on complete, docs/retention.md).
--
-- migrate() runs each statement in turn like 0001 and records schema_version = 4.

-- The last snapshot of each task a finish with `delete` removed (its aliases too), moved
-- here from `tasks` in that finish's transaction: the snapshot columns of `tasks`, with
-- the same types and its `seq`, which the events of the task name (`events.task_seq`),
-- and when it was deleted. The event reader joins `events` to `tasks` and to this table
-- by (seq, id) and reads the task's columns from whichever holds the row; deleted_task()
-- looks one up by id. prune_events() deletes the tombstones by `deleted_at` with the
-- events of that age. Ids are unique here as in `tasks`: a task enqueued again under the
-- id of a deleted one and deleted in turn replaces the older tombstone.
CREATE TABLE IF NOT EXISTS tombstones (
    seq              BIGINT       NOT NULL PRIMARY KEY,
    id               VARCHAR(64)  NOT NULL,
    task_type        VARCHAR(255) NOT NULL,
    status           VARCHAR(16)  NOT NULL,
    created_at       DATETIME(6)  NOT NULL,
    run_at           DATETIME(6)  NOT NULL,
    updated_at       DATETIME(6)  NOT NULL,
    app_id           VARCHAR(255),
    params           LONGTEXT     NOT NULL,
    data             LONGTEXT     NOT NULL,
    priority         BIGINT       NOT NULL,
    attempts         INT          NOT NULL,
    max_retries      INT          NOT NULL,
    result           LONGTEXT,
    error            TEXT,
    progress_done    DOUBLE       NOT NULL,
    progress_total   DOUBLE,
    progress_message TEXT,
    dedupe_key       VARCHAR(1024),
    alias_of         VARCHAR(64),
    parent_id        VARCHAR(64),
    user_id          VARCHAR(255),
    cancel_reason    VARCHAR(16),
    started_at       DATETIME(6),
    finished_at      DATETIME(6),
    worker_id        VARCHAR(255),
    lease_expires_at DATETIME(6),
    deleted_at       DATETIME(6)  NOT NULL,
    UNIQUE KEY tombstones_id (id),
    -- Pruning: tombstones by deletion time.
    KEY tombstones_deleted (deleted_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;
