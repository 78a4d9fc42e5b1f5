-- cGPUs a preemption takes back are kept for the head of the queue while they are detached, but
-- only for queue.reclaim_wait_secs from when they were taken (a detach stuck on a host that is
-- down must not hold the queue): when that was. NULL for every other detach.
ALTER TABLE cgpus ADD COLUMN reclaimed_ms BIGINT;

-- The highest priority a project's launches may ask for, when its quota is its own (NULL: no
-- ceiling below queue.max_priority).
ALTER TABLE quotas ADD COLUMN max_priority BIGINT;

-- Events are numbered within their VM, which keeps their order when several share a millisecond
-- and lets each VM keep only its latest ones.
ALTER TABLE vm_events ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
UPDATE vm_events SET seq = (SELECT COUNT(*) FROM vm_events o
    WHERE o.vm = vm_events.vm AND o.at_ms <= vm_events.at_ms);
DROP INDEX vm_events_by_vm;
CREATE INDEX vm_events_by_vm ON vm_events (vm, seq);

-- A queued launch on a cloud that creates servers as their tenant: the Keystone trust its tenant
-- delegated to gsaasd's service user at the launch (usable by that user only), until its server
-- is up or the launch ends.
CREATE TABLE delegations (
    vm TEXT PRIMARY KEY,
    trust TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
