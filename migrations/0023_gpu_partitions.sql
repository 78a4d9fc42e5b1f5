-- [3/6] Partitions of GPUs (MIG instances): a partition is a GPU of its own that names the GPU it
-- is carved from (on the same host) and its profile (`1g.10gb`). Both NULL for a whole GPU, as for
-- every GPU registered before. The parent's health covers its partitions (see `db::fences`).
ALTER TABLE gpus ADD COLUMN parent_gpu TEXT;
ALTER TABLE gpus ADD COLUMN mig_profile TEXT;
