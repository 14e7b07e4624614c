-- taskmill MySQL / MariaDB schema, version 3: global rate limits and global concurrency
-- limits.
--
-- migrate() runs each statement in turn like 0001 and records schema_version = 3.

-- One row per limited handler key (see taskmill.limits): scope is '*' for the host's
-- key (every task of the type) or CONCAT('=', app_id). A claim locks it (FOR UPDATE)
-- inside its own transaction, which serializes the claims of that key: `tokens` of the
-- token bucket as of `updated_at` (epoch seconds of the server clock). A
-- concurrency-only key's row carries no tokens that matter; its lock is what counts.
CREATE TABLE IF NOT EXISTS rate_buckets (
    scope      VARCHAR(256) NOT NULL,
    task_type  VARCHAR(255) NOT NULL,
    tokens     DOUBLE       NOT NULL,
    updated_at DOUBLE       NOT NULL,
    PRIMARY KEY (scope, task_type)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = @COLLATION@;
