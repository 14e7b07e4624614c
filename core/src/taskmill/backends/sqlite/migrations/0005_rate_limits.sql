-- taskmill SQLite schema, version 5: global rate limits and global concurrency limits.
--
-- Applied to a version-4 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- One row per limited handler key (see taskmill.limits): scope is '*' for the host's
-- key (every task of the type) or '=' || app_id. A claim reads and writes it inside its
-- own transaction: `tokens` of the token bucket as of `updated_at` (seconds of the
-- store's clock). A concurrency-only key's row carries no tokens that matter.
CREATE TABLE IF NOT EXISTS rate_buckets (
    scope      TEXT NOT NULL,
    task_type  TEXT NOT NULL,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, task_type)
) WITHOUT ROWID;
