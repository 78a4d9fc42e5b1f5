-- [1/5] GPU servers that GSaaS owns: on a host whose agent runs one server per cGPU
-- (`[gpu_servers] managed`), each cGPU's route goes to its own server's port, which the agent
-- chooses and reports. `hosts.managed_servers`: the host's table lists its GPUs' cGPUs for its
-- agent to serve; `gpus.managed`: a cGPU of the GPU is routed only once its server accepts (no
-- port yet: it is missing from its VM, not sent to the GPU's own endpoint). `cgpu_servers`: the
-- port of each cGPU's server that accepts, for the GPU it is on (a cGPU moved to another GPU has
-- none there until that GPU's agent reports one). Hosts and GPUs registered before run none.
-- `hosts.gpu_address`: the host's address on the GPU network, as its agent reports it: the only
-- source a managed server of another host takes its cGPU's traffic from (NULL: not reported).
ALTER TABLE hosts ADD COLUMN managed_servers BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN gpu_address TEXT;
ALTER TABLE gpus ADD COLUMN managed BIGINT NOT NULL DEFAULT 0;
CREATE TABLE cgpu_servers (
    vm TEXT NOT NULL,
    idx BIGINT NOT NULL,
    gpu TEXT NOT NULL,
    port BIGINT,
    over_share_ends BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (vm, idx, gpu)
);
CREATE INDEX cgpu_servers_by_gpu ON cgpu_servers (gpu);
