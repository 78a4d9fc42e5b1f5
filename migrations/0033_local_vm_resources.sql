-- [2/5]: a local VM's CPU and memory on its GPU host. What each host offers the local VMs
-- gsaasd pins to it (its agent's `[local_vms]`; NULL: unknown, only its GPUs bind), and what
-- each local VM takes there (its flavor's; NULL: not a local VM, or none known), which a
-- restarted gsaasd books again without reading every VM's request.
ALTER TABLE hosts ADD COLUMN local_vm_cpu_milli BIGINT;
ALTER TABLE hosts ADD COLUMN local_vm_memory_mib BIGINT;
ALTER TABLE vms ADD COLUMN local_cpu_milli BIGINT;
ALTER TABLE vms ADD COLUMN local_memory_mib BIGINT;
