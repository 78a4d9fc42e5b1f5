-- What the queue's preemption needs to find its victims without reading every launch request.
ALTER TABLE vms ADD COLUMN preemptible BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;

-- What happened to a VM that its owner should know of (its cGPUs taken back, given back), in order.
CREATE TABLE vm_events (
    vm TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX vm_events_by_vm ON vm_events (vm, at_ms);
