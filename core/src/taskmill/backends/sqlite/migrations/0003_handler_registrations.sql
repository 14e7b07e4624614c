-- taskmill SQLite schema, version 3: handler registrations kept in the store.
--
-- Applied to a version-2 database by `taskmill migrate` (or open(auto_migrate=True))
-- inside one BEGIN IMMEDIATE transaction.

-- One row per (app_id, task_type): a delegate at `url` runs those tasks (taskmill-http's
-- PUT /v1/handlers/{task_type}). A NULL app_id is the host's; it maps to an empty BLOB
-- in the unique index, which never equals a TEXT app id. updated_at is in microseconds.
CREATE TABLE IF NOT EXISTS handler_registrations (
    app_id      TEXT,
    task_type   TEXT    NOT NULL,
    url         TEXT    NOT NULL,
    timeout     REAL,
    max_retries INTEGER,
    concurrency INTEGER,
    updated_at  INTEGER NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS handler_registrations_key
    ON handler_registrations (ifnull(app_id, x''), task_type);
