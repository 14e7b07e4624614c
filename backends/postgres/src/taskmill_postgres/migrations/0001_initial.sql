-- taskmill PostgreSQL schema, version 1.
--
-- migrate() runs this file inside one transaction, holding an advisory lock keyed by the
-- schema name, with search_path set to the taskmill schema only (so the names below
-- land there), and then records schema_version = 1 in taskmill_meta. The IF NOT EXISTS
-- clauses only make a re-run on a schema whose recorded version was lost harmless.
--
-- Timestamps are timestamptz from the database clock (now()). params, data and result
-- are `json`: the text the core serialized, validated but kept byte for byte (key order,
-- number spelling), and still queryable with ->, ->> and casts to jsonb. Enums are text
-- by value. Creation order is `seq`.

CREATE TABLE IF NOT EXISTS taskmill_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE IF NOT EXISTS tasks (
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               text             NOT NULL,
    task_type        text             NOT NULL,
    status           text             NOT NULL
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    created_at       timestamptz      NOT NULL,
    run_at           timestamptz      NOT NULL,
    updated_at       timestamptz      NOT NULL,
    app_id           text,
    params           json             NOT NULL,
    data             json             NOT NULL DEFAULT '{}',
    priority         bigint           NOT NULL,
    attempts         integer          NOT NULL DEFAULT 0,
    max_retries      integer          NOT NULL,
    result           json,
    error            text,
    progress_done    double precision NOT NULL DEFAULT 0,
    progress_total   double precision,
    progress_message text,
    dedupe_key       text,
    alias_of         text,
    parent_id        text,
    user_id          text,
    cancel_reason    text
        CHECK (cancel_reason IN ('user', 'preempted', 'suspended', 'shutdown')),
    started_at       timestamptz,
    finished_at      timestamptz,
    worker_id        text,
    lease_expires_at timestamptz,
    CONSTRAINT tasks_id_key UNIQUE (id)
);

-- Claims: due PENDING leaders of one task type by priority DESC, then creation. Partial,
-- so it holds the queue only and stays small however many finished tasks the table
-- keeps. run_at and app_id are key columns after the ordering ones: the scan checks
-- `run_at <= now()` and `app_id = $1` on the index entry, before visiting the row.
CREATE INDEX IF NOT EXISTS tasks_claim
    ON tasks (task_type, priority DESC, seq, run_at, app_id)
    WHERE status = 'pending' AND alias_of IS NULL;

-- Lease rescue: RUNNING tasks by lease expiry.
CREATE INDEX IF NOT EXISTS tasks_lease
    ON tasks (lease_expires_at)
    WHERE status = 'running';

-- Retention: terminal tasks (exactly those with finished_at set) by finish time.
CREATE INDEX IF NOT EXISTS tasks_finished
    ON tasks (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS tasks_parent
    ON tasks (parent_id)
    WHERE parent_id IS NOT NULL;

-- Settling the aliases still waiting for their leader.
CREATE INDEX IF NOT EXISTS tasks_alias
    ON tasks (alias_of)
    WHERE alias_of IS NOT NULL AND status = 'pending';

-- At most one active (PENDING or RUNNING) dedupe leader per (app_id, task_type, key).
-- `app_id IS NULL` is part of the key so that the host (NULL) and an app named ''
-- are distinct scopes (NULLS NOT DISTINCT would need PostgreSQL 15).
CREATE UNIQUE INDEX IF NOT EXISTS tasks_dedupe_leader
    ON tasks ((coalesce(app_id, '')), (app_id IS NULL), task_type, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND alias_of IS NULL AND status IN ('pending', 'running');

-- The execution log: one row per finished attempt, read in id order. Rows name their
-- task by its seq (a bigint, cheaper to index than the text id).
CREATE TABLE IF NOT EXISTS attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    task_seq    bigint      NOT NULL,
    number      integer     NOT NULL,
    worker_id   text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    outcome     text        NOT NULL
        CHECK (outcome IN ('completed', 'failed', 'timed_out', 'cancelled', 'lost',
                           'interrupted')),
    error       text
);

CREATE INDEX IF NOT EXISTS attempts_task ON attempts (task_seq, id);

-- Stored suspensions. A NULL column means "any": (NULL, NULL) suspends everything,
-- (type, NULL) one task type of every app and of the host, (NULL, app) every type of one
-- app. Claims test this table inside their own statement.
CREATE TABLE IF NOT EXISTS suspensions (
    task_type  text,
    app_id     text,
    created_at timestamptz NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS suspensions_scope
    ON suspensions ((coalesce(task_type, '')), (task_type IS NULL),
                    (coalesce(app_id, '')), (app_id IS NULL));

-- The event log: one row per state change, written in the transaction that makes it.
--
-- seq is the reader's cursor and must grow in commit order: a reader that has seen seq
-- N must never later find a smaller seq appear. A plain sequence does not give that
-- (a transaction can draw a seq, then commit after one that drew a larger seq), so
-- every transaction that writes events takes a transaction-level advisory lock keyed
-- by the schema just before inserting them, as its last statement, and holds it until
-- it has committed. Event writers are thereby serialised from their first event to
-- their commit, and the seqs they draw follow commit order. (Those transactions also
-- NOTIFY, and PostgreSQL already serialises the commits of notifying transactions, so
-- the lock adds only the time of the event insert itself.) CACHE 1 keeps sessions from
-- holding blocks of numbers drawn in advance.
--
-- Events of deleted tasks are not deleted with them: readers skip them (the LEFT JOIN
-- finds no task) and prune_events removes them by age, a prefix of the log by seq.
CREATE TABLE IF NOT EXISTS events (
    seq      bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME event_cursor CACHE 1)
             PRIMARY KEY,
    task_seq bigint      NOT NULL,
    kind     text        NOT NULL,
    status   text        NOT NULL,
    at       timestamptz NOT NULL
);

-- Settle the pending aliases of terminal leaders: each takes its leader's status,
-- result, error and cancel reason. Returns (alias seq, leader seq) per settled alias.
--
-- A function because it must read with a snapshot of its own: an enqueue that made an
-- alias held a share lock on the leader while deciding, so a statement finishing that
-- leader waited for it to commit. A VOLATILE function's queries take a fresh snapshot
-- (which includes that alias) and see the changes of the statement that calls it (the
-- leaders' new status), so the finish, rescue and cancel statements call it after their
-- leaders' update and settle every alias, however the two raced.
CREATE OR REPLACE FUNCTION settle_aliases(leader_seqs bigint[])
    RETURNS TABLE (alias_seq bigint, leader_seq bigint)
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE tasks AS a
    SET status = l.status, result = l.result, error = l.error,
        cancel_reason = l.cancel_reason, finished_at = now(), updated_at = now()
    FROM tasks AS l
    WHERE l.seq = ANY(leader_seqs) AND l.status IN ('completed', 'failed', 'cancelled')
      AND a.alias_of = l.id AND a.status = 'pending'
    RETURNING a.seq, l.seq;
END
$$;
