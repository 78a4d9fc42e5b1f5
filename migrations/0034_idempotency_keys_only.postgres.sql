-- [3/5] PostgreSQL: the Idempotency-Keys' unique index holds only the VMs launched with a key.
-- 0001's table constraint UNIQUE (project, idempotency_key) indexed every VM, with a key or
-- without, and none of a saga's writes is a HOT update (see 0019), so each write of a VM added an
-- entry to it: five per launch and termination, for a key most launches do not give. NULL keys
-- never conflicted, so the partial index keeps exactly the rule the constraint kept; it is built
-- before the constraint goes, in the same transaction, so no moment lacks it. SQLite's twin
-- changes nothing: SQLite rewrites an index only when a write changes a column it holds, and its
-- constraint's index cannot be dropped without rebuilding `vms`.
CREATE UNIQUE INDEX vms_by_idempotency_key ON vms (project, idempotency_key)
WHERE idempotency_key IS NOT NULL;
ALTER TABLE vms DROP CONSTRAINT vms_project_idempotency_key_key;
