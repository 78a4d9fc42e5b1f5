-- [1/5] part 4: a shared cGPU's compute share, in percent of its GPU's SMs (MPS's active-thread
-- percentage), which its managed server is held to on a host that runs MPS. NULL: none
-- (time-sliced, or the whole GPU when exclusive). Fenced bookings keep theirs, so a restarted
-- gsaasd counts the shares of a fenced host's GPUs as the one before did.
ALTER TABLE cgpus ADD COLUMN compute_percent BIGINT;
ALTER TABLE fenced_cgpus ADD COLUMN compute_percent BIGINT;
