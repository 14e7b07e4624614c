-- taskmill MySQL / MariaDB schema, version 1.
--
-- migrate() runs each statement of this file in turn (DDL commits implicitly, so there
-- is no transaction around them) while holding GET_LOCK keyed by the database, in the
-- taskmill database (`USE`), and then records schema_version = 1 in taskmill_meta.
-- Every statement is idempotent (IF NOT EXISTS, INSERT ... ON DUPLICATE KEY UPDATE) so that a migration cut
-- short is simply run again. Indexes are declared inside CREATE TABLE: MySQL 8 has no
-- CREATE INDEX IF NOT EXISTS.
--
-- Text is utf8mb4 under a binary collation without padding (@COLLATION@ is replaced by
-- utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL): task types, app ids and
-- dedupe keys compare byte for byte, as on every other backend. Timestamps are
-- DATETIME(6) in UTC (every session sets time_zone = '+00:00'; values come from the
-- server clock). params, data and result are the JSON text the core serialized, kept
-- byte for byte. Enums are text by value. Creation order is `seq`.

CREATE TABLE IF NOT EXISTS taskmill_meta (
    `key`   VARCHAR(64)  NOT NULL PRIMARY KEY,
    `value` VARCHAR(255) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;

-- MySQL has no partial indexes; generated columns stand in for them:
--   claim_type    the task type while the task is a claimable PENDING leader, else NULL:
--                 tasks_claim holds the queue first and every finished task under NULL.
--   claim_rank    -priority: the claim order (priority DESC, seq ASC) becomes one
--                 ascending index order, usable on servers that ignore DESC in an
--                 index (MariaDB before 10.8).
--   dedupe_leader a hash of (app scope, task type, dedupe key) only while the task is an
--                 active (PENDING or RUNNING) dedupe leader, else NULL; under a UNIQUE
--                 index (NULLs never collide) it allows one active leader per key. The
--                 app scope tells the host (NULL) from an app named ''.
CREATE TABLE IF NOT EXISTS tasks (
    seq              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
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
    attempts         INT          NOT NULL DEFAULT 0,
    max_retries      INT          NOT NULL,
    result           LONGTEXT,
    error            TEXT,
    progress_done    DOUBLE       NOT NULL DEFAULT 0,
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
    claim_type       VARCHAR(255) AS
        (IF(status = 'pending' AND alias_of IS NULL, task_type, NULL)) STORED,
    claim_rank       BIGINT AS (-priority) STORED,
    dedupe_leader    BINARY(32) AS
        (IF(dedupe_key IS NOT NULL AND alias_of IS NULL AND status IN ('pending', 'running'),
            UNHEX(SHA2(CONCAT(IFNULL(CONCAT('a', app_id), 'h'), X'00', task_type, X'00',
                              dedupe_key), 256)),
            NULL)) STORED,
    CONSTRAINT tasks_status CHECK
        (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    CONSTRAINT tasks_cancel_reason CHECK
        (cancel_reason IN ('user', 'preempted', 'suspended', 'shutdown')),
    UNIQUE KEY tasks_id (id),
    -- Claims: due PENDING leaders of one type by priority DESC, then creation; run_at and
    -- app_id are checked on the index entry before the row is visited.
    KEY tasks_claim (claim_type, claim_rank, seq, run_at, app_id),
    -- Lease rescue: RUNNING tasks by lease expiry.
    KEY tasks_lease (status, lease_expires_at),
    -- Retention: terminal tasks by finish time.
    KEY tasks_finished (finished_at),
    KEY tasks_parent (parent_id),
    -- Settling the aliases still waiting for their leader.
    KEY tasks_alias (alias_of, status),
    UNIQUE KEY tasks_dedupe_leader (dedupe_leader)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;

-- The execution log: one row per finished attempt, read in id order.
CREATE TABLE IF NOT EXISTS attempts (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    task_seq    BIGINT       NOT NULL,
    task_id     VARCHAR(64)  NOT NULL,
    number      INT          NOT NULL,
    worker_id   VARCHAR(255) NOT NULL,
    started_at  DATETIME(6)  NOT NULL,
    finished_at DATETIME(6)  NOT NULL,
    outcome     VARCHAR(16)  NOT NULL,
    error       TEXT,
    KEY attempts_task (task_seq, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;

-- Stored suspensions. A NULL column means "any"; `scope` tells NULL from ''.
CREATE TABLE IF NOT EXISTS suspensions (
    task_type  VARCHAR(255),
    app_id     VARCHAR(255),
    created_at DATETIME(6) NOT NULL,
    type_scope VARCHAR(256) AS (IFNULL(CONCAT('=', task_type), '*')) STORED,
    app_scope  VARCHAR(256) AS (IFNULL(CONCAT('=', app_id), '*')) STORED,
    UNIQUE KEY suspensions_scope (type_scope, app_scope)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;

-- The claim gate: one row that claims share-lock (LOCK IN SHARE MODE) before reading the
-- suspensions and that suspend locks exclusively before storing one. A claim and a
-- suspension are thereby ordered: either the claim sees the suspension, or the
-- suspension's scan of RUNNING tasks sees what the claim took. Claims never wait for
-- each other on it.
CREATE TABLE IF NOT EXISTS claim_gate (
    id TINYINT NOT NULL PRIMARY KEY
) ENGINE = InnoDB;

INSERT INTO claim_gate (id) VALUES (1) ON DUPLICATE KEY UPDATE id = id;

-- The event log: one row per state change, written in the transaction that makes it.
--
-- seq is the readers' cursor and must grow in commit order: a reader that has seen seq
-- N must never later find a smaller seq appear. AUTO_INCREMENT does not give that (a
-- transaction draws a number, then commits after one that drew a larger one), so seqs
-- are drawn from the one row of event_cursor, locked (UPDATE ... LAST_INSERT_ID(value +
-- n)) by the statement before the events are inserted and held until commit: event writers
-- are serialised from drawing their seqs to their commit, and seqs follow commit order.
-- Events of deleted tasks stay until prune_events removes them by age; readers skip
-- them (the join on the task's seq and id finds nothing).
CREATE TABLE IF NOT EXISTS events (
    seq      BIGINT      NOT NULL PRIMARY KEY,
    task_seq BIGINT      NOT NULL,
    task_id  VARCHAR(64) NOT NULL,
    kind     VARCHAR(32) NOT NULL,
    status   VARCHAR(16) NOT NULL,
    at       DATETIME(6) NOT NULL,
    KEY events_at (at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;

CREATE TABLE IF NOT EXISTS event_cursor (
    id    TINYINT NOT NULL PRIMARY KEY,
    value BIGINT  NOT NULL
) ENGINE = InnoDB;

INSERT INTO event_cursor (id, value) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id;

-- One row per (app_id, task_type): a delegate at `url` runs those tasks (taskmill-http's
-- PUT /v1/handlers/{task_type}).
CREATE TABLE IF NOT EXISTS handler_registrations (
    app_id      VARCHAR(255),
    task_type   VARCHAR(255) NOT NULL,
    url         TEXT         NOT NULL,
    timeout     DOUBLE,
    max_retries INT,
    concurrency INT,
    updated_at  DATETIME(6)  NOT NULL,
    app_scope   VARCHAR(256) AS (IFNULL(CONCAT('=', app_id), '*')) STORED,
    UNIQUE KEY handler_registrations_key (app_scope, task_type)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;
