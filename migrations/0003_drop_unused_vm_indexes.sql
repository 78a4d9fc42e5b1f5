-- No query reads these, and every launch rewrote entries in both: vms_by_state on each change of a
-- VM's state, vms_by_host when the VM landed on its host. Lists go by project (vms_by_project),
-- route pushes by the partial index vms_routed, recovery by vms_saga_pending.
DROP INDEX vms_by_state;
DROP INDEX vms_by_host;
