-- [2/6] A VM's cGPU rows change only together with its `cgpus_version` (gsaasd's db/cgpus.rs), so
-- a reader holding a VM's cGPUs as of one version skips reading them again: a poll of a VM of
-- 75 cGPUs read and converted its 75 cGPUs every time.
ALTER TABLE vms ADD COLUMN cgpus_version BIGINT NOT NULL DEFAULT 0;
