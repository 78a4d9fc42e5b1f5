-- [3/6] What a GPU is beyond its model and memory: compute capability, its driver's CUDA version,
-- UUID and traits (gpgpums' `GpuAttributes`, as JSON). Reported by agents (NVML and the host's
-- config) or stated by the config inventory; requests constrain by them. '{}': nothing known,
-- as for every GPU registered before.
ALTER TABLE gpus ADD COLUMN attributes TEXT NOT NULL DEFAULT '{}';
