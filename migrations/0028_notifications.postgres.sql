-- [6/6] Notifications: PostgreSQL's twin of 0028_notifications.sqlite.sql, which says what is
-- written when and why. Each trigger's function takes the VM's next `notified_seq` by updating
-- its row (the row lock orders a VM's events as their transactions commit).

CREATE TABLE notifications (
    vm TEXT NOT NULL,
    seq BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (vm, seq)
);
CREATE INDEX notifications_by_time ON notifications (created_ms);

CREATE TABLE notifier (
    id BIGINT PRIMARY KEY,
    enabled BIGINT NOT NULL,
    lease_owner TEXT,
    lease_until_ms BIGINT NOT NULL
);
INSERT INTO notifier (id, enabled, lease_owner, lease_until_ms) VALUES (1, 0, NULL, 0);

ALTER TABLE vms ADD COLUMN notified_seq BIGINT NOT NULL DEFAULT 0;

CREATE VIEW notification_vms AS
SELECT v.id AS vm, jsonb_build_object(
    'project_id', v.project,
    'user_id', v.owner,
    'vm_id', v.id,
    'vm_name', v.name,
    'server_id', v.server_id,
    'state', v.state,
    'remoting', v.remoting,
    'ncgpus', (SELECT COUNT(*) FROM cgpus c WHERE c.vm = v.id AND c.state = 'live'),
    'gpu_memory_mib',
        (SELECT COALESCE(SUM(c.memory_mib), 0) FROM cgpus c WHERE c.vm = v.id AND c.state = 'live'),
    'cgpus', COALESCE((SELECT jsonb_agg(jsonb_build_object('index', c.idx, 'model', g.model,
                                                           'memory_mib', c.memory_mib,
                                                           'mode', c.mode)
                                        ORDER BY c.seq, c.idx)
                       FROM cgpus c JOIN gpus g ON g.id = c.gpu
                       WHERE c.vm = v.id AND c.state = 'live'), '[]'::jsonb)
) AS payload
FROM vms v;

-- Writes the VM's next notification: `event_type`, its payload with `extra` merged in.
CREATE FUNCTION gsaas_notify(vm_id TEXT, event_type TEXT, extra JSONB) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    next_seq BIGINT;
BEGIN
    UPDATE vms SET notified_seq = notified_seq + 1 WHERE id = vm_id RETURNING notified_seq
    INTO next_seq;
    INSERT INTO notifications (vm, seq, event_type, payload, created_ms)
    SELECT vm_id, next_seq, event_type, (n.payload || extra)::text, gsaas_now_ms()
    FROM notification_vms n WHERE n.vm = vm_id;
END $$;

CREATE FUNCTION gsaas_vms_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT enabled FROM notifier WHERE id = 1) <> 1 THEN
        RETURN NULL;
    END IF;
    PERFORM gsaas_notify(NEW.id, CASE NEW.state
        WHEN 'creating' THEN 'gpu.vm.create.start'
        WHEN 'ready' THEN 'gpu.vm.create.end'
        WHEN 'error' THEN 'gpu.vm.create.error'
        WHEN 'deleting' THEN 'gpu.vm.delete.start'
        ELSE 'gpu.vm.delete.end' END, '{}'::jsonb);
    RETURN NULL;
END $$;

CREATE TRIGGER vms_notify_insert AFTER INSERT ON vms
FOR EACH ROW WHEN (NEW.state = 'creating') EXECUTE FUNCTION gsaas_vms_notify();
CREATE TRIGGER vms_notify_update AFTER UPDATE OF state ON vms
FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
                   AND NEW.state IN ('creating', 'ready', 'error', 'deleting', 'deleted'))
EXECUTE FUNCTION gsaas_vms_notify();

CREATE FUNCTION gsaas_cgpus_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    model TEXT;
BEGIN
    IF (SELECT enabled FROM notifier WHERE id = 1) <> 1 THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        SELECT g.model INTO model FROM gpus g WHERE g.id = OLD.gpu;
        PERFORM gsaas_notify(OLD.vm, 'gpu.cgpu.detach.end', jsonb_build_object('cgpu',
            jsonb_build_object('index', OLD.idx, 'model', model, 'memory_mib', OLD.memory_mib,
                               'mode', OLD.mode)));
        RETURN NULL;
    END IF;
    SELECT g.model INTO model FROM gpus g WHERE g.id = NEW.gpu;
    PERFORM gsaas_notify(NEW.vm,
        CASE
            WHEN OLD.gpu IS DISTINCT FROM NEW.gpu THEN 'gpu.cgpu.rehome.end'
            WHEN OLD.reclaimed_ms IS NULL AND NEW.reclaimed_ms IS NOT NULL THEN 'gpu.vm.preempt'
            ELSE 'gpu.cgpu.attach.end'
        END,
        jsonb_build_object(
            'cgpu', jsonb_build_object('index', NEW.idx, 'model', model,
                                       'memory_mib', NEW.memory_mib, 'mode', NEW.mode),
            'previous_model', CASE WHEN OLD.gpu IS DISTINCT FROM NEW.gpu
                THEN (SELECT g.model FROM gpus g WHERE g.id = OLD.gpu) END));
    RETURN NULL;
END $$;

CREATE TRIGGER cgpus_notify_update AFTER UPDATE OF state, gpu, reclaimed_ms ON cgpus
FOR EACH ROW WHEN ((OLD.state = 'attaching' AND NEW.state = 'live')
                   OR OLD.gpu IS DISTINCT FROM NEW.gpu
                   OR (OLD.reclaimed_ms IS NULL AND NEW.reclaimed_ms IS NOT NULL))
EXECUTE FUNCTION gsaas_cgpus_notify();
CREATE TRIGGER cgpus_notify_delete AFTER DELETE ON cgpus
FOR EACH ROW WHEN (OLD.state = 'detaching') EXECUTE FUNCTION gsaas_cgpus_notify();

-- Off until a replica publishes (gsaasd's db::configure_notifier turns them on and off with
-- `notifier.enabled`): a trigger turned off costs nothing, one that finds the outbox off still
-- costs a PL/pgSQL call for every change of a VM.
ALTER TABLE vms DISABLE TRIGGER vms_notify_insert;
ALTER TABLE vms DISABLE TRIGGER vms_notify_update;
ALTER TABLE cgpus DISABLE TRIGGER cgpus_notify_update;
ALTER TABLE cgpus DISABLE TRIGGER cgpus_notify_delete;
