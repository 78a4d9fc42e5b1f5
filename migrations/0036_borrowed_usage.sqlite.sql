-- contract: replaces 0029's cGPU-starting usage triggers (their tables stay as they are, read as
-- before by every release since 0029; the log's events only gain a column older folds ignore).
--
-- [5/5] Borrowed cGPU time in usage reports: a cGPU's span records whether its cGPU was on loan
-- from its project's cohort (`cgpus.borrowed_ms` set, 0035), and a change of that mark while the
-- cGPU counts ends its span and starts the next at one instant, as a re-home does, so each second
-- of a cGPU is in exactly one span, borrowed or not. The mark is set when a cGPU is booked, and
-- taken off (app/background/loan_marks.rs) once its project is back within its quota. The
-- PostgreSQL twin is 0036_borrowed_usage.postgres.sql.
--
-- A start event (op 2) says `borrowed` (1 on loan, 0 not; NULL in an event logged before this
-- migration: not on loan), and the fold writes it into its span. A report adds the borrowed
-- spans' time apart (usage.rs), through their own partial index: few spans are borrowed, and the
-- covering index every report reads stays as it was. A replica of the previous release folding
-- during the upgrade writes its spans unmarked (it knows no loans; what it folds counts, once).

ALTER TABLE usage_events ADD COLUMN borrowed BIGINT;
ALTER TABLE cgpu_usage ADD COLUMN borrowed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX cgpu_usage_borrowed
    ON cgpu_usage (project, model, mode, start_ms, end_ms, memory_mib, vm, borrowed)
    WHERE borrowed = 1;

DROP TRIGGER cgpus_usage_log_insert;
DROP TRIGGER cgpus_usage_log_update;
DROP TRIGGER vms_usage_log_update;

CREATE TRIGGER cgpus_usage_log_insert AFTER INSERT ON cgpus
WHEN NEW.state = 'live'
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.vm, NEW.idx,
           v.project, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
           CASE WHEN NEW.borrowed_ms IS NULL THEN 0 ELSE 1 END
    FROM vms v, gpus g
    WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
END;

-- As 0029's: a change from live ends the span, a change to live (or to another GPU, live) starts
-- the next, with the loan mark the cGPU has after the change.
CREATE TRIGGER cgpus_usage_log_update AFTER UPDATE OF state, gpu ON cgpus
WHEN (OLD.state IS NOT NEW.state OR OLD.gpu IS NOT NEW.gpu)
     AND (OLD.state = 'live' OR NEW.state = 'live')
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    SELECT 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), OLD.vm, OLD.idx
    WHERE OLD.state = 'live'
      AND EXISTS (SELECT 1 FROM vms WHERE id = OLD.vm AND state IN ('creating', 'ready'));
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.vm, NEW.idx,
           v.project, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
           CASE WHEN NEW.borrowed_ms IS NULL THEN 0 ELSE 1 END
    FROM vms v, gpus g
    WHERE NEW.state = 'live' AND v.id = NEW.vm AND g.id = NEW.gpu
      AND v.state IN ('creating', 'ready');
END;

-- A VM starts or stops counting: so do its live cGPUs (as 0029's, each with its loan mark).
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
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), c.vm, c.idx,
           NEW.project, c.gpu, g.model, c.mode, c.memory_mib,
           CASE WHEN c.borrowed_ms IS NULL THEN 0 ELSE 1 END
    FROM cgpus c JOIN gpus g ON g.id = c.gpu
    WHERE NEW.state IN ('creating', 'ready') AND c.vm = NEW.id AND c.state = 'live';
END;

-- A counting cGPU's loan mark set or taken off, nothing else of it changing (a change of its
-- state or GPU in the same statement is the trigger above's, which starts the next span with the
-- new mark): its span ends and the next starts, at one instant (SQLite's clock stands still
-- within a statement, its triggers' included).
CREATE TRIGGER cgpus_usage_log_loan AFTER UPDATE OF borrowed_ms ON cgpus
WHEN (OLD.borrowed_ms IS NULL) IS NOT (NEW.borrowed_ms IS NULL)
     AND OLD.state = 'live' AND NEW.state = 'live' AND OLD.gpu = NEW.gpu
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    SELECT 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), OLD.vm, OLD.idx
    WHERE EXISTS (SELECT 1 FROM vms WHERE id = OLD.vm AND state IN ('creating', 'ready'));
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NEW.vm, NEW.idx,
           v.project, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
           CASE WHEN NEW.borrowed_ms IS NULL THEN 0 ELSE 1 END
    FROM vms v, gpus g
    WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
END;

-- What is on loan and counting as this migration runs counts as borrowed from now on: its span
-- ends and a borrowed one starts, in one statement (one instant), each end before its start.
INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
SELECT o.op, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), c.vm, c.idx,
       CASE WHEN o.op = 2 THEN v.project END, CASE WHEN o.op = 2 THEN c.gpu END,
       CASE WHEN o.op = 2 THEN g.model END, CASE WHEN o.op = 2 THEN c.mode END,
       CASE WHEN o.op = 2 THEN c.memory_mib END, CASE WHEN o.op = 2 THEN 1 END
FROM cgpus c JOIN vms v ON v.id = c.vm JOIN gpus g ON g.id = c.gpu,
     (SELECT 1 AS op UNION ALL SELECT 2) o
WHERE c.state = 'live' AND c.borrowed_ms IS NOT NULL AND v.state IN ('creating', 'ready')
ORDER BY c.vm, c.idx, o.op;
