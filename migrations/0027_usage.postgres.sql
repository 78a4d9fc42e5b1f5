-- [6/6] Usage metering: PostgreSQL's twin of 0027_usage.sqlite.sql, which says what counts and
-- why. The tables and indexes are the same; the triggers call PL/pgSQL functions. Times are
-- clock_timestamp() (the time of the statement, not of its transaction's start: a transaction
-- that waited for the pool's lock must not end a span before another began it).

CREATE TABLE cgpu_usage (
    project TEXT NOT NULL,
    vm TEXT NOT NULL,
    idx BIGINT NOT NULL,
    gpu TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    memory_mib BIGINT NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT,
    rolled BIGINT NOT NULL DEFAULT 0
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

CREATE TABLE usage_totals (
    project TEXT NOT NULL,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    cgpu_ms BIGINT NOT NULL,
    memory_mib_ms DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (project, model, mode)
);

CREATE FUNCTION gsaas_now_ms() RETURNS BIGINT LANGUAGE sql VOLATILE AS
$$ SELECT CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT) $$;

CREATE FUNCTION gsaas_cgpus_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE cgpu_usage SET end_ms = GREATEST(start_ms, gsaas_now_ms())
        WHERE vm = OLD.vm AND idx = OLD.idx AND end_ms IS NULL;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state = 'live' THEN
        INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
        SELECT v.project, NEW.vm, NEW.idx, NEW.gpu, g.model, NEW.mode, NEW.memory_mib,
               gsaas_now_ms()
        FROM vms v, gpus g
        WHERE v.id = NEW.vm AND g.id = NEW.gpu AND v.state IN ('creating', 'ready');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER cgpus_usage_insert AFTER INSERT ON cgpus
FOR EACH ROW WHEN (NEW.state = 'live') EXECUTE FUNCTION gsaas_cgpus_usage();
CREATE TRIGGER cgpus_usage_update AFTER UPDATE OF state, gpu ON cgpus
FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.gpu IS DISTINCT FROM NEW.gpu)
EXECUTE FUNCTION gsaas_cgpus_usage();
CREATE TRIGGER cgpus_usage_delete AFTER DELETE ON cgpus
FOR EACH ROW WHEN (OLD.state = 'live') EXECUTE FUNCTION gsaas_cgpus_usage();

CREATE FUNCTION gsaas_vms_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        UPDATE vm_usage SET end_ms = GREATEST(start_ms, gsaas_now_ms())
        WHERE vm = OLD.id AND end_ms IS NULL;
        UPDATE cgpu_usage SET end_ms = GREATEST(start_ms, gsaas_now_ms())
        WHERE vm = OLD.id AND end_ms IS NULL;
    END IF;
    IF NEW.state IN ('creating', 'ready') THEN
        INSERT INTO vm_usage (project, vm, name, start_ms)
        VALUES (NEW.project, NEW.id, NEW.name, gsaas_now_ms());
        IF TG_OP = 'UPDATE' THEN
            INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
            SELECT NEW.project, c.vm, c.idx, c.gpu, g.model, c.mode, c.memory_mib, gsaas_now_ms()
            FROM cgpus c JOIN gpus g ON g.id = c.gpu
            WHERE c.vm = NEW.id AND c.state = 'live';
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER vms_usage_insert AFTER INSERT ON vms
FOR EACH ROW WHEN (NEW.state IN ('creating', 'ready')) EXECUTE FUNCTION gsaas_vms_usage();
CREATE TRIGGER vms_usage_update AFTER UPDATE OF state ON vms
FOR EACH ROW
WHEN ((OLD.state IN ('creating', 'ready')) IS DISTINCT FROM (NEW.state IN ('creating', 'ready')))
EXECUTE FUNCTION gsaas_vms_usage();

INSERT INTO vm_usage (project, vm, name, start_ms)
SELECT project, id, name, gsaas_now_ms() FROM vms WHERE state IN ('creating', 'ready');
INSERT INTO cgpu_usage (project, vm, idx, gpu, model, mode, memory_mib, start_ms)
SELECT v.project, c.vm, c.idx, c.gpu, g.model, c.mode, c.memory_mib, gsaas_now_ms()
FROM cgpus c JOIN vms v ON v.id = c.vm JOIN gpus g ON g.id = c.gpu
WHERE c.state = 'live' AND v.state IN ('creating', 'ready');
