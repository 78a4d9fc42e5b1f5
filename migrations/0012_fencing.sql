-- [4/5] When things break.
--
-- A fence holds cGPU bookings whose routes may still be live on a host whose agent could not be
-- reached (a termination or detach there), or that a re-homed cGPU left: the capacity stays
-- taken until that host's agent confirms a table of at least `generation` (computed after the
-- routes were withdrawn), or an admin forgets the host. `id` is the fence's holder in the pool.
CREATE TABLE fences (
    id TEXT PRIMARY KEY,
    vm TEXT NOT NULL,
    host TEXT NOT NULL REFERENCES hosts (name),
    generation BIGINT NOT NULL,
    reason TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
CREATE INDEX fences_by_host ON fences (host);

CREATE TABLE fenced_cgpus (
    fence TEXT NOT NULL REFERENCES fences (id),
    idx BIGINT NOT NULL,
    gpu TEXT NOT NULL REFERENCES gpus (id),
    memory_mib BIGINT NOT NULL,
    mode TEXT NOT NULL,
    PRIMARY KEY (fence, idx)
);
CREATE INDEX fenced_cgpus_by_gpu ON fenced_cgpus (gpu);

-- Why a GPU's agent says it is unhealthy (XID or ECC errors, gone from the bus, or what the
-- host's config says); NULL: healthy. An unhealthy GPU takes no new cGPUs, like a tainted one.
ALTER TABLE gpus ADD COLUMN health TEXT;

-- An admin declared the host dead: its routes count as gone, and nothing is pushed to it until
-- its agent registers again.
ALTER TABLE hosts ADD COLUMN forgotten BIGINT NOT NULL DEFAULT 0;

-- Cloud drift: the reconciler finds VMs by the servers Nova reports changed.
CREATE INDEX vms_by_server ON vms (server_id);
