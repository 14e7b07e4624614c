-- taskmill PostgreSQL schema, version 7: a dependent cancelled by its dependency settles
-- its dedupe aliases.
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 7.
--
-- Before, a PENDING dependent that was also a dedupe leader ended CANCELLED when a
-- dependency failed, but its PENDING aliases stayed PENDING with a terminal leader:
-- never claimed (aliases never are), never ended, and waiting on one hung. Every store
-- had the same gap. The settlement engine of the other stores (taskmill.settlement)
-- now settles a cancelled dependent's aliases like any ended leader's, and the shipped
-- differential test (ReferenceContract.test_settlement_matches_the_reference_store)
-- holds this function to it. The function is otherwise the one of
-- 0005_settle_dependents_fast_path.sql: the aliases it settles take the leader's
-- status, error and cancel reason (the settle_aliases function of 0001), get the
-- leader's event kind, are returned with the cancelled dependents, and have their own
-- dependents settled in the next round.

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
    alias record;
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
                FOR alias IN
                    SELECT s.alias_seq FROM settle_aliases(ARRAY[dependent.seq]) AS s
                    ORDER BY s.alias_seq
                LOOP
                    INSERT INTO events (task_seq, kind, status, at)
                        VALUES (alias.alias_seq, 'cancelled', 'cancelled', now());
                    later := later || alias.alias_seq;
                    cancelled := cancelled || alias.alias_seq;
                    changed := changed + 1;
                END LOOP;
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
