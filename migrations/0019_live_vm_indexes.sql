-- [2/6] A write of a VM adds an entry to every index of `vms` whose predicate holds for the new
-- row: none of the saga's writes is a HOT update, as each changes `step`, which vms_saga_pending's
-- predicate reads. The lookups by server and the quota count ask only for live VMs (creating or
-- ready), so these two indexes hold only those: a termination's writes (deleting, then deleted)
-- and the rows of every VM that ended no longer touch them. On PostgreSQL the saga's VM writes had
-- become two to three times dearer per VM than with the four indexes of b917a7f.
DROP INDEX vms_by_server;
CREATE INDEX vms_by_server ON vms (server_id) WHERE state IN ('creating', 'ready');
DROP INDEX vms_by_project_state;
CREATE INDEX vms_live_by_project ON vms (project) WHERE state IN ('creating', 'ready');
