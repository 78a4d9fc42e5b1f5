-- cGPUs attached to and detached from running VMs (the paper's progressive attach).
-- `seq` orders a VM's cGPUs as they were attached (the order of RCUDA_DEVICE_<n>); `state` is
-- live, attaching (booked, its route being installed) or detaching (its route withdrawn, its
-- booking released next). Routes serve live and attaching cGPUs.
ALTER TABLE cgpus ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cgpus ADD COLUMN state TEXT NOT NULL DEFAULT 'live';

-- Idempotency-Keys of attaches, per project (a launch's key is on its VM).
CREATE TABLE attach_keys (
    project TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    vm TEXT NOT NULL REFERENCES vms (id),
    request_digest TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (project, idempotency_key)
);
CREATE INDEX attach_keys_by_vm ON attach_keys (vm);
