-- [4/6] The remote-GPU layer a VM's cGPUs speak (`rcuda`, `lupine`), also in its launch request:
-- a column of its own so that the route tables, read for every host at once, give each VM its
-- layer's environment without parsing JSON, even when it has no cGPU left (all lost or
-- detached). Every VM launched before speaks rCUDA.
ALTER TABLE vms ADD COLUMN remoting TEXT NOT NULL DEFAULT 'rcuda';
