-- taskmill PostgreSQL schema, version 3: task dependencies (`after=`, docs/dependencies.md).
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 3.

-- How many of a task's dependencies have not ended yet; the claim takes only tasks at 0.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS waiting_on integer NOT NULL DEFAULT 0;

-- One row per unresolved edge: `task_id` waits for `depends_on`; deleted when the
-- dependency ends, in that transaction. `always` is after_policy="always".
CREATE TABLE IF NOT EXISTS task_dependencies (
    depends_on text    NOT NULL,
    task_id    text    NOT NULL,
    always     boolean NOT NULL,
    PRIMARY KEY (depends_on, task_id)
);

CREATE INDEX IF NOT EXISTS task_dependencies_dependent ON task_dependencies (task_id);

-- Settle the dependents of tasks that just ended (the finish, rescue and cancel
-- statements call it with the seqs they changed, aliases included): each resolved edge
-- is deleted and takes one off its dependent's count when the dependent is PENDING;
-- the last one RELEASES it (event 'released', a 'work' notification), and a dependency
-- that ended otherwise than COMPLETED under after_policy "completed" CANCELS it (reason
-- 'preempted', an error naming the dependency), which in turn settles its own
-- dependents. These are the rules of taskmill.lifecycle (dependency_blocks,
-- dependency_settles, dependency_error), which the shared contract suite checks here.
--
-- A VOLATILE function for the reason settle_aliases is one: its queries take a fresh
-- snapshot, so they see the calling statement's updates and every edge an enqueue
-- committed while that statement waited for the dependency's row (an enqueue holds a
-- share lock on its dependencies while it decides). Its events are inserted behind the
-- events lock (events_lock; re-entrant in the transaction), as every event is.
-- Returns the seqs of the dependents it cancelled.
CREATE OR REPLACE FUNCTION settle_dependents(
    ended_seqs bigint[], events_lock bigint, channel text
)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    level bigint[] := ended_seqs;
    later bigint[];
    edge record;
    dependent record;
    changed bigint := 0;
    cancelled bigint[] := '{}';
    released boolean := false;
BEGIN
    WHILE cardinality(level) > 0 LOOP
        later := '{}';
        FOR edge IN
            DELETE FROM task_dependencies AS e USING tasks AS d
            WHERE d.seq = ANY(level) AND e.depends_on = d.id
              AND d.status IN ('completed', 'failed', 'cancelled')
            RETURNING e.task_id, e.always, d.id AS dependency_id, d.status AS ended_as
        LOOP
            UPDATE tasks SET waiting_on = waiting_on - 1
            WHERE id = edge.task_id AND status = 'pending'
            RETURNING seq, waiting_on INTO dependent;
            CONTINUE WHEN NOT FOUND;
            IF NOT edge.always AND edge.ended_as <> 'completed' THEN
                UPDATE tasks SET status = 'cancelled', cancel_reason = 'preempted',
                    error = 'dependency ' || edge.dependency_id || ' ' || edge.ended_as
                        || '; cancelled with it (after_policy)',
                    finished_at = now(), updated_at = now(),
                    worker_id = NULL, lease_expires_at = NULL
                WHERE seq = dependent.seq;
                PERFORM pg_advisory_xact_lock(events_lock);
                INSERT INTO events (task_seq, kind, status, at)
                    VALUES (dependent.seq, 'cancelled', 'cancelled', now());
                later := later || dependent.seq;
                cancelled := cancelled || dependent.seq;
                changed := changed + 1;
            ELSIF dependent.waiting_on = 0 THEN
                PERFORM pg_advisory_xact_lock(events_lock);
                INSERT INTO events (task_seq, kind, status, at)
                    VALUES (dependent.seq, 'released', 'pending', now());
                released := true;
                changed := changed + 1;
            END IF;
        END LOOP;
        level := later;
    END LOOP;
    IF changed > 0 THEN
        PERFORM pg_notify(channel || 'events', '');
    END IF;
    IF released THEN
        PERFORM pg_notify(channel || 'work', '');
    END IF;
    RETURN cancelled;
END
$$;
