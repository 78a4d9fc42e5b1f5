-- Each project's own quota limits (projects without a row have the configured defaults). A NULL
-- limit is no limit on that resource.
CREATE TABLE quotas (
    project TEXT PRIMARY KEY,
    cgpus BIGINT,
    memory_mib BIGINT,
    exclusive_gpus BIGINT,
    vms BIGINT,
    updated_ms BIGINT NOT NULL
);
