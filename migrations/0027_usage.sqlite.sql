-- [6/6] Usage metering: each VM's and each cGPU's billable lifetimes, kept beyond the VM (a purge
-- leaves them) for reports of any period (gsaasd's db/usage.rs).
--
-- A cGPU counts while it is `live` and its VM is `creating` or `ready`: from its launch's booking
-- or its attach's end, until its detach (the owner's, a preemption's or a give-back) begins, its
-- GPU fails (lost), its VM's termination begins, or it is released. A re-home ends its span on
-- the old GPU and starts one on the new (its model may differ). A VM counts while it is
-- `creating` or `ready`.
--
-- Triggers keep the spans, in the same transaction as the change of the rows they follow, so
-- every path that changes a cGPU or a VM (a booking, a batch of saga writes, a re-home, a fence,
-- a queue round) is counted once, whichever replica makes it. Times are the database's clock in
-- milliseconds since the Unix epoch (one clock for every replica). The PostgreSQL twin of this
-- file is 0027_usage.postgres.sql: the tables are the same, the triggers in its dialect.

CREATE TABLE cgpu_usage (
    project TEXT NOT NULL,
    vm TEXT NOT NULL,
    idx BIGINT NOT NULL,
    gpu TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    memory_mib BIGINT NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT,                      -- NULL while it counts
    rolled BIGINT NOT NULL DEFAULT 0    -- ended and added to usage_totals
);
CREATE INDEX cgpu_usage_open ON cgpu_usage (vm, idx) WHERE end_ms IS NULL;
-- Covering, in the order a report groups by: a month's report for every project reads it
-- once without a sort or a table lookup; one project's reads its part.
CREATE INDEX cgpu_usage_by_project
    ON cgpu_usage (project, model, mode, start_ms, end_ms, memory_mib);
-- Ended spans not yet in usage_totals, by when they ended (a span still counting is in
-- cgpu_usage_open only: a launch writes one index entry fewer).
CREATE INDEX cgpu_usage_unrolled ON cgpu_usage (end_ms) WHERE rolled = 0 AND end_ms IS NOT NULL;

CREATE TABLE vm_usage (
    project TEXT NOT NULL,
    vm TEXT NOT NULL,
    name TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT
);
CREATE INDEX vm_usage_open ON vm_usage (vm) WHERE end_ms IS NULL;
CREATE INDEX vm_usage_by_project ON vm_usage (project, start_ms, end_ms);

-- Every ended cGPU span's time, added up per project, model and mode once (the `/metrics`
-- counters: what every replica reads, whatever was purged).
CREATE TABLE usage_totals (
    project TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    cgpu_ms BIGINT NOT NULL,
    memory_mib_ms DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (project, model, mode)
);

-- A cGPU booked live on a VM that counts.
CREATE TRIGGER cgpus_usage_insert AFTER INSERT ON cgpus
WHEN NEW.state = 'live'
BEGIN
    INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
    SELECT v.project, NEW.vm, NEW.idx, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v, gpus g
    WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
END;

-- A cGPU's state or GPU changed: its span ends, and a new one starts if it still counts.
CREATE TRIGGER cgpus_usage_update AFTER UPDATE OF state, gpu ON cgpus
WHEN OLD.state IS NOT NEW.state OR OLD.gpu IS NOT NEW.gpu
BEGIN
    UPDATE cgpu_usage
    SET end_ms = MAX(start_ms, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
    WHERE vm = OLD.vm AND idx = OLD.idx AND end_ms IS NULL;
    INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
    SELECT v.project, NEW.vm, NEW.idx, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v, gpus g
    WHERE NEW.state = 'live' AND v.id = NEW.vm AND g.id = NEW.gpu
      AND v.state IN ('creating', 'ready');
END;

CREATE TRIGGER cgpus_usage_delete AFTER DELETE ON cgpus
WHEN OLD.state = 'live'
BEGIN
    UPDATE cgpu_usage
    SET end_ms = MAX(start_ms, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
    WHERE vm = OLD.vm AND idx = OLD.idx AND end_ms IS NULL;
END;

CREATE TRIGGER vms_usage_insert AFTER INSERT ON vms
WHEN NEW.state IN ('creating', 'ready')
BEGIN
    INSERT INTO vm_usage (project, vm, name, start_ms)
    VALUES (NEW.project, NEW.id, NEW.name,
            CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER));
END;

-- A VM starts or stops counting: so do its live cGPUs.
CREATE TRIGGER vms_usage_update AFTER UPDATE OF state ON vms
WHEN (OLD.state IN ('creating', 'ready')) IS NOT (NEW.state IN ('creating', 'ready'))
BEGIN
    UPDATE vm_usage
    SET end_ms = MAX(start_ms, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
    WHERE vm = OLD.id AND end_ms IS NULL;
    UPDATE cgpu_usage
    SET end_ms = MAX(start_ms, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
    WHERE vm = OLD.id AND end_ms IS NULL;
    INSERT INTO vm_usage (project, vm, name, start_ms)
    SELECT NEW.project, NEW.id, NEW.name,
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    WHERE NEW.state IN ('creating', 'ready');
    INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
    SELECT NEW.project, c.vm, c.idx, c.gpu, g.model, c.mode, c.memory_mib,
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM cgpus c JOIN gpus g ON g.id = c.gpu
    WHERE NEW.state IN ('creating', 'ready') AND c.vm = NEW.id AND c.state = 'live';
END;

-- What counted already when this migration ran counts from now on.
INSERT INTO vm_usage (project, vm, name, start_ms)
SELECT project, id, name, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
FROM vms WHERE state IN ('creating', 'ready');
INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
SELECT v.project, c.vm, c.idx, c.gpu, g.model, c.mode, c.memory_mib,
       CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
FROM cgpus c JOIN vms v ON v.id = c.vm JOIN gpus g ON g.id = c.gpu
WHERE c.state = 'live' AND v.state IN ('creating', 'ready');
