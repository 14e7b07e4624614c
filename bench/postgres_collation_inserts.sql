-- The cost of a btree key comparison under the database's collation against "C"
-- (schema 6 of taskmill-postgres, docs/benchmarks.md "Issue 15: flow between claims and
-- finishes"): 300,000 random UUID texts inserted into a text primary key of each
-- collation, twice, alternated. Run in a scratch database of the collation to measure:
--
--     psql -d scratch -f bench/postgres_collation_inserts.sql
\timing on
DROP TABLE IF EXISTS bench_collation_c, bench_collation_default;
CREATE UNLOGGED TABLE bench_collation_c (id text COLLATE "C" PRIMARY KEY);
CREATE UNLOGGED TABLE bench_collation_default (id text PRIMARY KEY);
SELECT datcollate FROM pg_database WHERE datname = current_database();
INSERT INTO bench_collation_default SELECT gen_random_uuid()::text FROM generate_series(1, 300000);
INSERT INTO bench_collation_c SELECT gen_random_uuid()::text FROM generate_series(1, 300000);
INSERT INTO bench_collation_default SELECT gen_random_uuid()::text FROM generate_series(1, 300000);
INSERT INTO bench_collation_c SELECT gen_random_uuid()::text FROM generate_series(1, 300000);
DROP TABLE bench_collation_c, bench_collation_default;
