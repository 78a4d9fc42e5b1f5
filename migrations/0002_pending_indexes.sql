-- Indexes over the few live rows, not the history: deleted VMs stay in `vms` for their records, so
-- queries the launch path and the reconciler run per request or per pass must not scan them.

-- The VMs whose routes belong in a host's table (every route push reads them).
CREATE INDEX vms_routed ON vms (host) WHERE routes_on = 1;

-- Sagas with work left (the reconciler's recovery pass).
CREATE INDEX vms_saga_pending ON vms (saga_lease_until_ms) WHERE step <> 'done';
