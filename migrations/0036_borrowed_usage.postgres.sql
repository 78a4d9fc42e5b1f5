-- [5/5] Borrowed cGPU time in usage reports: PostgreSQL's twin of
-- 0036_borrowed_usage.sqlite.sql, which says why and what the events and spans record. The
-- functions of 0029 and 0032 that start a cGPU's span are replaced in place (their triggers
-- stay), each start now saying whether the cGPU is on loan; a new trigger ends a counting cGPU's
-- span and starts the next, at one instant, when its loan mark is set or taken off.

ALTER TABLE usage_events ADD COLUMN borrowed BIGINT;
ALTER TABLE cgpu_usage ADD COLUMN borrowed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX cgpu_usage_borrowed
    ON cgpu_usage (project, model, mode, start_ms, end_ms, memory_mib, vm, borrowed)
    WHERE borrowed = 1;

CREATE OR REPLACE FUNCTION gsaas_cgpus_usage_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, gsaas_now_ms(), a.vm, a.idx, v.project, a.gpu, g.model, a.mode, a.memory_mib,
           CASE WHEN a.borrowed_ms IS NULL THEN 0 ELSE 1 END
    FROM added a
    CROSS JOIN LATERAL (SELECT project FROM vms
                        WHERE id = a.vm AND state IN ('creating', 'ready') LIMIT 1) v
    CROSS JOIN LATERAL (SELECT model FROM gpus WHERE id = a.gpu LIMIT 1) g
    WHERE a.state = 'live';
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION gsaas_cgpus_usage_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    instant BIGINT := gsaas_now_ms();
BEGIN
    IF OLD.state = 'live' AND EXISTS (SELECT 1 FROM vms
                                      WHERE id = OLD.vm AND state IN ('creating', 'ready')) THEN
        INSERT INTO usage_events (op, at_ms, vm, idx)
        VALUES (1, instant, OLD.vm, OLD.idx);
    END IF;
    IF NEW.state = 'live' THEN
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib,
                                  borrowed)
        SELECT 2, instant, NEW.vm, NEW.idx, v.project, NEW.gpu, g.model, NEW.mode,
               NEW.memory_mib, CASE WHEN NEW.borrowed_ms IS NULL THEN 0 ELSE 1 END
        FROM vms v, gpus g
        WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION gsaas_vms_usage_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    instant BIGINT := gsaas_now_ms();
BEGIN
    IF OLD.state IN ('creating', 'ready') THEN
        INSERT INTO usage_events (op, at_ms, vm) VALUES (3, instant, OLD.id);
    ELSE
        INSERT INTO usage_events (op, at_ms, vm, project, name)
        VALUES (4, instant, NEW.id, NEW.project, NEW.name);
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib,
                                  borrowed)
        SELECT 2, instant, c.vm, c.idx, NEW.project, c.gpu, g.model, c.mode, c.memory_mib,
               CASE WHEN c.borrowed_ms IS NULL THEN 0 ELSE 1 END
        FROM cgpus c JOIN gpus g ON g.id = c.gpu
        WHERE c.vm = NEW.id AND c.state = 'live';
    END IF;
    RETURN NULL;
END $$;

-- A live cGPU's loan mark set or taken off, its state and GPU unchanged (a change of either in
-- the same statement is gsaas_cgpus_usage_changed's, which starts the next span with the new
-- mark): if its VM counts, its span ends and the next starts at one instant.
CREATE FUNCTION gsaas_cgpus_usage_loan_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    instant BIGINT := gsaas_now_ms();
BEGIN
    IF EXISTS (SELECT 1 FROM vms WHERE id = OLD.vm AND state IN ('creating', 'ready')) THEN
        INSERT INTO usage_events (op, at_ms, vm, idx)
        VALUES (1, instant, OLD.vm, OLD.idx);
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib,
                                  borrowed)
        SELECT 2, instant, NEW.vm, NEW.idx, v.project, NEW.gpu, g.model, NEW.mode,
               NEW.memory_mib, CASE WHEN NEW.borrowed_ms IS NULL THEN 0 ELSE 1 END
        FROM vms v, gpus g
        WHERE v.id = NEW.vm AND g.id = NEW.gpu;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cgpus_usage_log_loan AFTER UPDATE OF borrowed_ms ON cgpus
FOR EACH ROW WHEN ((OLD.borrowed_ms IS NULL) IS DISTINCT FROM (NEW.borrowed_ms IS NULL)
                   AND OLD.state = 'live' AND NEW.state = 'live' AND OLD.gpu = NEW.gpu)
EXECUTE FUNCTION gsaas_cgpus_usage_loan_changed();

-- What is on loan and counting as this migration runs counts as borrowed from now on: its span
-- ends and a borrowed one starts, at one instant, the ends logged before the starts.
DO $$
DECLARE
    instant BIGINT := gsaas_now_ms();
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    SELECT 1, instant, c.vm, c.idx
    FROM cgpus c JOIN vms v ON v.id = c.vm
    WHERE c.state = 'live' AND c.borrowed_ms IS NOT NULL AND v.state IN ('creating', 'ready');
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib, borrowed)
    SELECT 2, instant, c.vm, c.idx, v.project, c.gpu, g.model, c.mode, c.memory_mib, 1
    FROM cgpus c JOIN vms v ON v.id = c.vm JOIN gpus g ON g.id = c.gpu
    WHERE c.state = 'live' AND c.borrowed_ms IS NOT NULL AND v.state IN ('creating', 'ready');
END $$;
