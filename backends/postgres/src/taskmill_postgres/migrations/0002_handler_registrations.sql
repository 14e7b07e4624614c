-- taskmill PostgreSQL schema, version 2: handler registrations kept in the store.
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 2.

-- One row per (app_id, task_type): a delegate at `url` runs those tasks (taskmill-http's
-- PUT /v1/handlers/{task_type}). A NULL app_id is the host's; the unique index keeps it
-- apart from an app id '' with its (app_id IS NULL) column.
CREATE TABLE IF NOT EXISTS handler_registrations (
    app_id      text,
    task_type   text             NOT NULL,
    url         text             NOT NULL,
    timeout     double precision,
    max_retries integer,
    concurrency integer,
    updated_at  timestamptz      NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS handler_registrations_key
    ON handler_registrations ((coalesce(app_id, '')), (app_id IS NULL), task_type);
