-- [3/5] SQLite's twin of 0034_idempotency_keys_only.postgres.sql, which gives PostgreSQL a unique
-- index of the Idempotency-Keys that holds only the VMs launched with one. Nothing changes here:
-- SQLite rewrites an index only when a write changes a column it holds (a saga's writes never
-- change `project` or `idempotency_key`), and the index of 0001's constraint cannot be dropped
-- without rebuilding `vms`.
SELECT 1;
