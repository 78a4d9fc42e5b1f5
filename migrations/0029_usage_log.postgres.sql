-- contract: replaces 0027's usage triggers (their tables stay as they are, read as before by
-- every release since 0027; only how they are written changes).
--
-- [6/6] The usage log: PostgreSQL's twin of 0029_usage_log.sqlite.sql, which says why and what
-- each event means. `seq` has no index: the fold takes every row it sees (DELETE ... RETURNING,
-- under an advisory lock that keeps folds one at a time) and orders them itself. Inserts of
-- cGPUs and VMs (a launch books a batch in one statement) log their events once per statement,
-- from the statement's transition table; updates, which a column list narrows to the changes
-- that matter, once per row that changed.

CREATE TABLE usage_events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
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

DROP TRIGGER cgpus_usage_insert ON cgpus;
DROP TRIGGER cgpus_usage_update ON cgpus;
DROP TRIGGER cgpus_usage_delete ON cgpus;
DROP TRIGGER vms_usage_insert ON vms;
DROP TRIGGER vms_usage_update ON vms;
DROP FUNCTION gsaas_cgpus_usage();
DROP FUNCTION gsaas_vms_usage();

-- Each added row looks its VM and GPU up by key (LATERAL, LIMIT 1 so the planner cannot turn the
-- lookups back into a join): a transition table has no statistics, and a join the planner sized
-- at a thousand rows read the whole of `vms` for every launch (cycles/s halved on PostgreSQL).
CREATE FUNCTION gsaas_cgpus_usage_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
    SELECT 2, gsaas_now_ms(), a.vm, a.idx, v.project, a.gpu, g.model, a.mode, a.memory_mib
    FROM added a
    CROSS JOIN LATERAL (SELECT project FROM vms
                        WHERE id = a.vm AND state IN ('creating', 'ready') LIMIT 1) v
    CROSS JOIN LATERAL (SELECT model FROM gpus WHERE id = a.gpu LIMIT 1) g
    WHERE a.state = 'live';
    RETURN NULL;
END $$;
CREATE TRIGGER cgpus_usage_log_insert AFTER INSERT ON cgpus
REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION gsaas_cgpus_usage_added();

CREATE FUNCTION gsaas_cgpus_usage_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, idx)
    SELECT 1, gsaas_now_ms(), r.vm, r.idx
    FROM removed r
    CROSS JOIN LATERAL (SELECT 1 FROM vms
                        WHERE id = r.vm AND state IN ('creating', 'ready') LIMIT 1) v
    WHERE r.state = 'live';
    RETURN NULL;
END $$;
CREATE TRIGGER cgpus_usage_log_delete AFTER DELETE ON cgpus
REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION gsaas_cgpus_usage_removed();

-- A span is open only while its cGPU is live and its VM counts: a change from live ends it (an
-- end of a VM that no longer counts ended it already, and is not logged), a change to live (or
-- to another GPU, live) starts the next if its VM counts.
CREATE FUNCTION gsaas_cgpus_usage_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'live' AND EXISTS (SELECT 1 FROM vms
                                      WHERE id = OLD.vm AND state IN ('creating', 'ready')) THEN
        INSERT INTO usage_events (op, at_ms, vm, idx)
        VALUES (1, gsaas_now_ms(), OLD.vm, OLD.idx);
    END IF;
    IF NEW.state = 'live' THEN
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
        SELECT 2, gsaas_now_ms(), NEW.vm, NEW.idx, v.project, NEW.gpu, g.model, NEW.mode,
               NEW.memory_mib
        FROM vms v, gpus g
        WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cgpus_usage_log_update AFTER UPDATE OF state, gpu ON cgpus
FOR EACH ROW WHEN ((OLD.state IS DISTINCT FROM NEW.state OR OLD.gpu IS DISTINCT FROM NEW.gpu)
                   AND (OLD.state = 'live' OR NEW.state = 'live'))
EXECUTE FUNCTION gsaas_cgpus_usage_changed();

CREATE FUNCTION gsaas_vms_usage_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_events (op, at_ms, vm, project, name)
    SELECT 4, gsaas_now_ms(), a.id, a.project, a.name FROM added a
    WHERE a.state IN ('creating', 'ready');
    RETURN NULL;
END $$;
CREATE TRIGGER vms_usage_log_insert AFTER INSERT ON vms
REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION gsaas_vms_usage_added();

-- A VM starts or stops counting: so do its live cGPUs.
CREATE FUNCTION gsaas_vms_usage_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('creating', 'ready') THEN
        INSERT INTO usage_events (op, at_ms, vm) VALUES (3, gsaas_now_ms(), OLD.id);
    ELSE
        INSERT INTO usage_events (op, at_ms, vm, project, name)
        VALUES (4, gsaas_now_ms(), NEW.id, NEW.project, NEW.name);
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
        SELECT 2, gsaas_now_ms(), c.vm, c.idx, NEW.project, c.gpu, g.model, c.mode, c.memory_mib
        FROM cgpus c JOIN gpus g ON g.id = c.gpu
        WHERE c.vm = NEW.id AND c.state = 'live';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER vms_usage_log_update AFTER UPDATE OF state ON vms
FOR EACH ROW
WHEN ((OLD.state IN ('creating', 'ready')) IS DISTINCT FROM (NEW.state IN ('creating', 'ready')))
EXECUTE FUNCTION gsaas_vms_usage_changed();
