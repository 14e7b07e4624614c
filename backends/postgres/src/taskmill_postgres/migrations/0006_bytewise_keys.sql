-- taskmill PostgreSQL schema, version 6: the key columns of `tasks` compare bytewise.
--
-- migrate() runs this file like 0001 (one transaction, advisory lock, search_path set
-- to the taskmill schema) and records schema_version = 6.
--
-- Every text column of `tasks` that an index holds (ids, task types, app ids, dedupe
-- keys) takes the "C" collation. taskmill only tests these for equality and never
-- sorts by them, and equality is bytewise under every deterministic collation, so no
-- result changes. What changes is the cost of keeping the indexes: a btree descent
-- compares the key with a dozen others, and under the database's default collation
-- (en_US.UTF-8, C.UTF-8, ...) each comparison of two different strings is a strcoll()
-- call; under "C" it is a memcmp(). Each task adds an entry to tasks_id_key three
-- times (enqueue, claim, finish: none of these updates is HOT) and the finish looks it
-- up once more. Measured in a database of collation en_US.UTF-8: the server CPU of a
-- claim fell from 23.5 to 21.5 us per task and a finish's from 32.5 to 29.5 (medians
-- of 5 alternated rounds; under C.UTF-8, whose strcoll is a code-point comparison,
-- nothing measurable changed; docs/benchmarks.md, "Issue 15: flow between claims and
-- finishes").
--
-- Comparisons with text of the default collation (parameters, task_dependencies,
-- other tables) resolve to "C" (a column's collation wins over the default one).
--
-- PostgreSQL rebuilds the indexes on these columns, holding an ACCESS EXCLUSIVE lock
-- on `tasks` for as long as that takes: on a table of millions of tasks, migrate at a
-- quiet time (docs/backends/postgresql.md, "Migrations").

ALTER TABLE tasks
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN task_type TYPE text COLLATE "C",
    ALTER COLUMN app_id TYPE text COLLATE "C",
    ALTER COLUMN dedupe_key TYPE text COLLATE "C",
    ALTER COLUMN alias_of TYPE text COLLATE "C",
    ALTER COLUMN parent_id TYPE text COLLATE "C";
