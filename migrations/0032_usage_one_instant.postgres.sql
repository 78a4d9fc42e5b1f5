-- A change of one row logs its events at one instant. 0029's update triggers read the clock once
-- per event (`gsaas_now_ms()` is `clock_timestamp()`), so a cGPU moved to another GPU could end
-- its span a millisecond or two before the next began on a loaded host (CI saw 2 ms), and a VM
-- that starts counting again could start before its cGPUs. SQLite's twin changes nothing: its
-- clock stands still within a statement. The triggers and what they log are otherwise 0029's.

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
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
        SELECT 2, instant, NEW.vm, NEW.idx, v.project, NEW.gpu, g.model, NEW.mode,
               NEW.memory_mib
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
        INSERT INTO usage_events (op, at_ms, vm, idx, project, gpu, model, mode, memory_mib)
        SELECT 2, instant, c.vm, c.idx, NEW.project, c.gpu, g.model, c.mode, c.memory_mib
        FROM cgpus c JOIN gpus g ON g.id = c.gpu
        WHERE c.vm = NEW.id AND c.state = 'live';
    END IF;
    RETURN NULL;
END $$;
