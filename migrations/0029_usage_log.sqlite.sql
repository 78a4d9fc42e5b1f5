-- contract: replaces 0027's usage triggers (their tables stay as they are, read as before by
-- every release since 0027; only how they are written changes).
--
-- [6/6] The usage log: 0027's triggers wrote each span, with its indexes, inside every launch's
-- and termination's transaction, and launch + terminate cycles lost 13-20% of their throughput
-- to it (BENCHMARKS.md). Now the triggers append one row per change to `usage_events`, a table
-- without an index of its own (appended at its end, emptied by the fold), and gsaasd folds the
-- log into `cgpu_usage` and `vm_usage` off the requests' path (app/background/usage_fold.rs, in
-- one transaction that also empties what it folded), on a timer and before every report: spans
-- keep exactly the times the triggers record, only written later. What counts is unchanged (see
-- 0027_usage.sqlite.sql). The PostgreSQL twin is 0029_usage_log.postgres.sql.
--
-- Events (`op`), replayed in `seq` order, which is commit order for any two that touch the same
-- cGPU or VM (both hold its row):
--   1 cGPU span ends (vm, idx)            2 cGPU span starts (vm, idx, project, gpu, model, ...)
--   3 VM span ends, and its cGPUs' (vm)   4 VM span starts (vm, project, name)

CREATE TABLE usage_events (
    seq INTEGER PRIMARY KEY,
    op BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    vm TEXT NOT NULL,
    idx BIGINT,
    project TEXT,
    name TEXT,
    gpu TEXT,
    model TEXT,
    mode TEXT,
    memory_mib BIGINT
);

DROP TRIGGER cgpus_usage_insert;
DROP TRIGGER cgpus_usage_update;
DROP TRIGGER cgpus_usage_delete;
DROP TRIGGER vms_usage_insert;
DROP TRIGGER vms_usage_update;

CREATE TRIGGER cgpus_usage_log_insert AFTER INSERT ON cgpus
WHEN NEW.state = 'live'
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.vm, NEW.idx,
           v.project, NEW.gpu, g.model, NEW.mode, NEW.memory_mib
    FROM vms v, gpus g
    WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
END;

-- A span is open only while its cGPU is live and its VM counts: a change from live ends it (an
-- end of a VM that no longer counts ended it already, and is not logged), a change to live (or
-- to another GPU, live) starts the next if its VM counts.
CREATE TRIGGER cgpus_usage_log_update AFTER UPDATE OF state, gpu ON cgpus
WHEN (OLD.state IS NOT NEW.state OR OLD.gpu IS NOT NEW.gpu)
     AND (OLD.state = 'live' OR NEW.state = 'live')
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    SELECT 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), OLD.vm, OLD.idx
    WHERE OLD.state = 'live'
      AND EXISTS (SELECT 1 FROM vms WHERE id = OLD.vm AND state IN ('creating', 'ready'));
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.vm, NEW.idx,
           v.project, NEW.gpu, g.model, NEW.mode, NEW.memory_mib
    FROM vms v, gpus g
    WHERE NEW.state = 'live' AND v.id = NEW.vm AND g.id = NEW.gpu
      AND v.state IN ('creating', 'ready');
END;

CREATE TRIGGER cgpus_usage_log_delete AFTER DELETE ON cgpus
WHEN OLD.state = 'live'
     AND EXISTS (SELECT 1 FROM vms WHERE id = OLD.vm AND state IN ('creating', 'ready'))
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    VALUES (1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), OLD.vm, OLD.idx);
END;

CREATE TRIGGER vms_usage_log_insert AFTER INSERT ON vms
WHEN NEW.state IN ('creating', 'ready')
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, project, name)
    VALUES (4, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.id, NEW.project,
            NEW.name);
END;

-- A VM starts or stops counting: so do its live cGPUs.
CREATE TRIGGER vms_usage_log_update AFTER UPDATE OF state ON vms
WHEN (OLD.state IN ('creating', 'ready')) IS NOT (NEW.state IN ('creating', 'ready'))
BEGIN
    INSERT INTO usage_events (op, at_ms, vm)
    SELECT 3, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), OLD.id
    WHERE OLD.state IN ('creating', 'ready');
    INSERT INTO usage_events (op, at_ms, vm, project, name)
    SELECT 4, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.id, NEW.project,
           NEW.name
    WHERE NEW.state IN ('creating', 'ready');
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), c.vm, c.idx,
           NEW.project, c.gpu, g.model, c.mode, c.memory_mib
    FROM cgpus c JOIN gpus g ON g.id = c.gpu
    WHERE NEW.state IN ('creating', 'ready') AND c.vm = NEW.id AND c.state = 'live';
END;
