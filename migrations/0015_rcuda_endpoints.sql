-- [1/6] An rCUDA endpoint belongs to one GPU of one host, across the whole pool.
--
-- Before, endpoints were unique only inside one host's report: a hostile agent could register a
-- GPU at another host's rCUDA server, and two tenants' exclusive cGPUs were then routed to one
-- device. `rcuda_claimed` marks the GPUs whose endpoint is theirs alone; the unique index below
-- makes that a constraint of the database, whichever replica writes. Simulated hosts (in-process
-- agents without a GPU network address) serve nothing: their loopback endpoints claim nothing.
ALTER TABLE gpus ADD COLUMN rcuda_claimed BIGINT NOT NULL DEFAULT 1;
UPDATE gpus SET rcuda_claimed = 0 WHERE rcuda_address LIKE '127.%';

-- Endpoints claimed twice before this migration: the GPU registered first keeps its claim (and
-- the rCUDA server its host); every later one is quarantined (tainted, so it takes no new cGPUs;
-- what it backs runs on) for an admin to look at.
UPDATE gpus SET rcuda_claimed = 0,
    taint = 'its rCUDA endpoint (' || rcuda_address || ':' || CAST(rcuda_port AS TEXT)
        || ') was claimed before by a GPU of another host; quarantined when endpoints became unique'
WHERE rcuda_claimed = 1 AND EXISTS (
    SELECT 1 FROM gpus first
    JOIN hosts first_host ON first_host.name = first.host
    JOIN hosts this_host ON this_host.name = gpus.host
    WHERE first.id <> gpus.id
      AND first.rcuda_address = gpus.rcuda_address
      AND first.rcuda_port = gpus.rcuda_port
      AND (first.host <> gpus.host OR first.rcuda_gpu_number = gpus.rcuda_gpu_number)
      AND (first_host.seq < this_host.seq
           OR (first_host.seq = this_host.seq AND first.idx < gpus.idx))
);

CREATE UNIQUE INDEX gpus_by_rcuda_endpoint
    ON gpus (rcuda_address, rcuda_port, rcuda_gpu_number) WHERE rcuda_claimed = 1;

-- What an agent did that admins should know of (a claim on another host's endpoint, a refusal
-- that names another host's GPU, fences it never confirmed), newest kept, per host.
CREATE TABLE host_alerts (
    host TEXT NOT NULL,
    seq BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (host, seq)
);
