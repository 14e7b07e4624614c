-- taskmill PostgreSQL schema, version 5: settle_dependents returns at once when no task
-- waits for another.
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 5.
--
-- Every finish, rescue and cancel statement calls settle_dependents with the seqs it
-- ended. Without any edge, its DELETE still looked up every one of those tasks by seq
-- (2-3 us of server CPU per finished task, about a tenth of a finish; docs/benchmarks.md,
-- "Issue 15: flow between claims and finishes"). The function is otherwise the one of 0003_dependencies.sql, which says
-- what it does and why it is a VOLATILE function.

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
    -- No edge at all, the common case: nothing to settle. This look takes a snapshot as
    -- fresh as the DELETE's below would (each query of a VOLATILE function takes its
    -- own), so it sees every edge that DELETE would have seen.
    IF NOT EXISTS (SELECT 1 FROM task_dependencies) THEN
        RETURN cancelled;
    END IF;
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
