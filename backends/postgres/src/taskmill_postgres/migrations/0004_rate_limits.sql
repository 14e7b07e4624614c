-- taskmill PostgreSQL schema, version 4: global rate limits and global concurrency limits.
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 4.

-- One row per limited handler key (see taskmill.limits): scope is '*' for the host's
-- key (every task of the type) or '=' || app_id. A claim locks it (FOR UPDATE) inside
-- its own transaction, which serializes the claims of that key: `tokens` of the token
-- bucket as of `updated_at` (epoch seconds of the database clock). A concurrency-only
-- key's row carries no tokens that matter; its lock is what counts.
CREATE TABLE IF NOT EXISTS rate_buckets (
    scope      text             NOT NULL,
    task_type  text             NOT NULL,
    tokens     double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (scope, task_type)
);
