-- taskmill PostgreSQL schema, version 8: tasks deleted by their finish, and their
-- tombstones (delete_completed, delete_failed: docs/retention.md, "Delete on complete").
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 8.
--
-- A finish with Finish.delete that ends its task COMPLETED or FAILED deletes, in its own
-- statement (Statements.finish_deleting), the task, the aliases it settled and the
-- execution log of all of them, after settling their aliases and dependents, and keeps
-- each one's last snapshot here. Two ways, by what the finish is:
--
-- * A deleting COMPLETE never updates the row: the statement deletes it and writes its
--   tombstone from the row the update would have written (DELETE ... RETURNING), which
--   spares the index entries an update adds. Its aliases take its result from the
--   tombstone (settle_aliases_of_deleted), its dependents are settled by the
--   four-argument settle_dependents, given its id (the row is gone for the functions'
--   snapshots), and forget_tasks then deletes the aliases.
-- * A deleting FAIL (whose kind a stop request committed meanwhile turns into a RELEASE
--   that keeps the task, decided only as the row is written) updates the row as in keep
--   mode; once its aliases and dependents are settled, forget_tasks deletes it and
--   those aliases.

-- The last snapshot of each task deleted by its finish: the columns of `tasks`, with
-- the same types and collations, and when it was deleted. `seq` is the task's: the
-- event reader joins a task's events here on it when the task row is gone.
-- deleted_task reads a tombstone by `id`; prune_events deletes those as old as the
-- events it prunes (tombstones_age). A task id enqueued again after its delete and
-- deleted again replaces its tombstone.
CREATE TABLE IF NOT EXISTS tombstones (
    seq              bigint           PRIMARY KEY,
    id               text COLLATE "C" NOT NULL,
    task_type        text COLLATE "C" NOT NULL,
    status           text             NOT NULL,
    created_at       timestamptz      NOT NULL,
    run_at           timestamptz      NOT NULL,
    updated_at       timestamptz      NOT NULL,
    app_id           text COLLATE "C",
    params           json             NOT NULL,
    data             json             NOT NULL,
    priority         bigint           NOT NULL,
    attempts         integer          NOT NULL,
    max_retries      integer          NOT NULL,
    result           json,
    error            text,
    progress_done    double precision NOT NULL,
    progress_total   double precision,
    progress_message text,
    dedupe_key       text COLLATE "C",
    alias_of         text COLLATE "C",
    parent_id        text COLLATE "C",
    user_id          text,
    cancel_reason    text,
    started_at       timestamptz,
    finished_at      timestamptz,
    worker_id        text,
    lease_expires_at timestamptz,
    waiting_on       integer          NOT NULL,
    deleted_at       timestamptz      NOT NULL,
    CONSTRAINT tombstones_id_key UNIQUE (id)
);

CREATE INDEX IF NOT EXISTS tombstones_age ON tombstones (deleted_at);

-- Delete the tasks `task_seqs` (ended; their aliases and dependents already settled)
-- with their execution logs, keeping each row as its tombstone. Returns how many.
--
-- A function because the finish statement that calls it updated these rows: a
-- statement cannot delete a row it updated itself (the second change is ignored),
-- while the queries of a VOLATILE function run after the statement's changes so far,
-- and see them.
CREATE OR REPLACE FUNCTION forget_tasks(task_seqs bigint[])
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    forgotten bigint;
BEGIN
    DELETE FROM attempts WHERE task_seq = ANY(task_seqs);
    WITH gone AS (
        DELETE FROM tasks WHERE seq = ANY(task_seqs)
        RETURNING seq, id, task_type, status, created_at, run_at, updated_at, app_id,
            params, data, priority, attempts, max_retries, result, error, progress_done,
            progress_total, progress_message, dedupe_key, alias_of, parent_id, user_id,
            cancel_reason, started_at, finished_at, worker_id, lease_expires_at, waiting_on
    )
    INSERT INTO tombstones (seq, id, task_type, status, created_at, run_at, updated_at,
        app_id, params, data, priority, attempts, max_retries, result, error,
        progress_done, progress_total, progress_message, dedupe_key, alias_of, parent_id,
        user_id, cancel_reason, started_at, finished_at, worker_id, lease_expires_at,
        waiting_on, deleted_at)
    SELECT gone.*, now() FROM gone
    ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, task_type = EXCLUDED.task_type,
        status = EXCLUDED.status, created_at = EXCLUDED.created_at,
        run_at = EXCLUDED.run_at, updated_at = EXCLUDED.updated_at,
        app_id = EXCLUDED.app_id, params = EXCLUDED.params, data = EXCLUDED.data,
        priority = EXCLUDED.priority, attempts = EXCLUDED.attempts,
        max_retries = EXCLUDED.max_retries, result = EXCLUDED.result,
        error = EXCLUDED.error, progress_done = EXCLUDED.progress_done,
        progress_total = EXCLUDED.progress_total,
        progress_message = EXCLUDED.progress_message, dedupe_key = EXCLUDED.dedupe_key,
        alias_of = EXCLUDED.alias_of, parent_id = EXCLUDED.parent_id,
        user_id = EXCLUDED.user_id, cancel_reason = EXCLUDED.cancel_reason,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        worker_id = EXCLUDED.worker_id, lease_expires_at = EXCLUDED.lease_expires_at,
        waiting_on = EXCLUDED.waiting_on, deleted_at = EXCLUDED.deleted_at;
    GET DIAGNOSTICS forgotten = ROW_COUNT;
    RETURN forgotten;
END
$$;

-- settle_aliases (0001) for leaders deleted by this statement without an update (their
-- rows are gone for the function's snapshot): each leader's status, result, error and
-- cancel reason are read from its tombstone, which the statement wrote before calling
-- this. Returns (alias seq, leader seq) per settled alias.
CREATE OR REPLACE FUNCTION settle_aliases_of_deleted(leader_seqs bigint[])
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
    FROM tombstones AS l
    WHERE l.seq = ANY(leader_seqs) AND l.status IN ('completed', 'failed', 'cancelled')
      AND a.alias_of = l.id AND a.status = 'pending'
    RETURNING a.seq, l.seq;
END
$$;

-- settle_dependents (0007) for a finish that also deleted tasks it COMPLETED without
-- updating their rows (`completed_ids`, see above): the tasks `ended_seqs` are settled
-- by the three-argument function, then each edge on a deleted task is resolved as a
-- COMPLETED dependency resolves it (it takes one off its PENDING dependent's count, and
-- the last one RELEASES the dependent: event 'released', 'work' notification). A
-- completion cancels nothing, so nothing cascades. The same fresh snapshot as the
-- three-argument function's sees edges an enqueue committed while the finish waited
-- for the row. Returns the seqs of the dependents the first part cancelled.
CREATE OR REPLACE FUNCTION settle_dependents(
    ended_seqs bigint[], events_lock bigint, channel text, completed_ids text[]
)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    edge record;
    dependent record;
    cancelled bigint[] := '{}';
    released boolean := false;
BEGIN
    IF cardinality(ended_seqs) > 0 THEN
        cancelled := settle_dependents(ended_seqs, events_lock, channel);
    END IF;
    IF coalesce(cardinality(completed_ids), 0) = 0
        OR NOT EXISTS (SELECT 1 FROM task_dependencies) THEN
        RETURN cancelled;
    END IF;
    FOR edge IN
        DELETE FROM task_dependencies AS e WHERE e.depends_on = ANY(completed_ids)
        RETURNING e.task_id
    LOOP
        UPDATE tasks SET waiting_on = waiting_on - 1
        WHERE id = edge.task_id AND status = 'pending'
        RETURNING seq, waiting_on INTO dependent;
        CONTINUE WHEN NOT FOUND;
        IF dependent.waiting_on = 0 THEN
            PERFORM pg_advisory_xact_lock(events_lock);
            INSERT INTO events (task_seq, kind, status, at)
                VALUES (dependent.seq, 'released', 'pending', now());
            released := true;
        END IF;
    END LOOP;
    IF released THEN
        PERFORM pg_notify(channel || 'events', '');
        PERFORM pg_notify(channel || 'work', '');
    END IF;
    RETURN cancelled;
END
$$;
