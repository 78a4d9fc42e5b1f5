-- GSaaS schema, portable between SQLite and PostgreSQL: TEXT, BIGINT, no dialect types.
-- Times are milliseconds since the Unix epoch; ids are text (UUIDs, host names, GPU ids).

-- One row whose generation every change of GPU bookings or inventory bumps, in the same transaction.
-- Bumping it first serializes reservations across gsaasd replicas (a row lock on PostgreSQL, the
-- write lock on SQLite) and tells each replica whether its in-memory pool is current.
CREATE TABLE pool_state (
    id BIGINT PRIMARY KEY,
    generation BIGINT NOT NULL
);
INSERT INTO pool_state (id, generation) VALUES (1, 0);

CREATE TABLE hosts (
    name TEXT PRIMARY KEY,
    seq BIGINT NOT NULL UNIQUE,           -- registration order: the pool order
    kind TEXT NOT NULL,                   -- compute-gpu | compute-rgpu | compute
    state TEXT NOT NULL,                  -- schedulable | drained | unavailable
    drained BIGINT NOT NULL DEFAULT 0,    -- an operator's drain, kept across heartbeats
    agent_url TEXT,
    last_seen_ms BIGINT NOT NULL,
    routes_generation BIGINT NOT NULL DEFAULT 0,   -- generation of the last table computed
    applied_generation BIGINT NOT NULL DEFAULT 0   -- generation the agent confirmed
);

CREATE TABLE gpus (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL REFERENCES hosts (name),
    idx BIGINT NOT NULL,
    model TEXT NOT NULL,
    memory_mib BIGINT NOT NULL,
    rcuda_address TEXT NOT NULL,
    rcuda_port BIGINT NOT NULL,
    rcuda_gpu_number BIGINT NOT NULL,
    UNIQUE (host, idx)
);

CREATE TABLE vms (
    id TEXT PRIMARY KEY,
    project TEXT NOT NULL,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    request TEXT NOT NULL,                -- the launch request as JSON
    policy TEXT NOT NULL,
    state TEXT NOT NULL,                  -- creating | ready | error | deleting | deleted
    error TEXT,
    step TEXT NOT NULL,                   -- the saga's next step
    server_id TEXT,
    host TEXT,
    fixed_ip TEXT,
    tap TEXT,
    routes_on BIGINT NOT NULL DEFAULT 0,  -- whether the VM's routes belong in its host's table
    timings TEXT NOT NULL,                -- per-stage seconds as JSON
    idempotency_key TEXT,
    request_digest TEXT,
    version BIGINT NOT NULL DEFAULT 0,   -- optimistic concurrency between the saga and terminations
    saga_owner TEXT,
    saga_lease_until_ms BIGINT NOT NULL DEFAULT 0,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    UNIQUE (project, idempotency_key)
);
CREATE INDEX vms_by_project ON vms (project, created_ms);
CREATE INDEX vms_by_host ON vms (host);
CREATE INDEX vms_by_state ON vms (state);

-- A VM's cGPUs, present exactly while the VM holds its reservation.
CREATE TABLE cgpus (
    vm TEXT NOT NULL REFERENCES vms (id),
    idx BIGINT NOT NULL,
    gpu TEXT NOT NULL REFERENCES gpus (id),
    memory_mib BIGINT NOT NULL,
    mode TEXT NOT NULL,
    masked_address TEXT NOT NULL,
    masked_port BIGINT NOT NULL,
    PRIMARY KEY (vm, idx)
);
CREATE INDEX cgpus_by_gpu ON cgpus (gpu);
