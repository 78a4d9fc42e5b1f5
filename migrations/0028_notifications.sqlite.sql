-- [6/6] Notifications: an outbox of OpenStack-style notifications (gsaasd's db/notifications.rs),
-- written by triggers in the same transaction as the change each reports, published to RabbitMQ
-- afterwards (app/background/notifications.rs) and deleted once the broker confirmed them.
--
-- Events: a VM's state changes (gpu.vm.create.start when it is booked, .create.end when ready,
-- .create.error, gpu.vm.delete.start, .delete.end), a cGPU's attach ending live
-- (gpu.cgpu.attach.end), its release after a detach (gpu.cgpu.detach.end), its re-home
-- (gpu.cgpu.rehome.end) and a preemption taking it back (gpu.vm.preempt).
--
-- Order per VM: every event of a VM takes the next `vms.notified_seq` under the VM's row lock, so
-- a VM's events are numbered without gaps in the order their transactions commit, and the
-- publisher sends each VM's in that order. Nothing is written while `notifier.enabled` is 0 (no
-- replica is configured to publish). Payloads name no host, GPU or GPU server: metering services
-- show them to tenants. The PostgreSQL twin is 0028_notifications.postgres.sql.

CREATE TABLE notifications (
    vm TEXT NOT NULL,
    seq BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    payload TEXT NOT NULL,              -- JSON
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (vm, seq)
);
CREATE INDEX notifications_by_time ON notifications (created_ms);

-- One row: whether notifications are written, and which replica publishes them (a lease).
CREATE TABLE notifier (
    id BIGINT PRIMARY KEY,
    enabled BIGINT NOT NULL,
    lease_owner TEXT,
    lease_until_ms BIGINT NOT NULL
);
INSERT INTO notifier (id, enabled, lease_owner, lease_until_ms) VALUES (1, 0, NULL, 0);

ALTER TABLE vms ADD COLUMN notified_seq BIGINT NOT NULL DEFAULT 0;

-- What every notification says of its VM: who, which, and its live cGPUs (model, memory, mode).
CREATE VIEW notification_vms AS
SELECT v.id AS vm, json_object(
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
    'cgpus', json((SELECT json_group_array(json(j)) FROM (
        SELECT json_object('index', c.idx, 'model', g.model, 'memory_mib', c.memory_mib,
                           'mode', c.mode) AS j
        FROM cgpus c JOIN gpus g ON g.id = c.gpu
        WHERE c.vm = v.id AND c.state = 'live' ORDER BY c.seq, c.idx)))
) AS payload
FROM vms v;

CREATE TRIGGER vms_notify_insert AFTER INSERT ON vms
WHEN NEW.state = 'creating' AND (SELECT enabled FROM notifier WHERE id = 1) = 1
BEGIN
    UPDATE vms SET notified_seq = notified_seq + 1 WHERE id = NEW.id;
    INSERT INTO notifications (vm, seq, event_type, payload, created_ms)
    SELECT v.id, v.notified_seq, 'gpu.vm.create.start', n.payload,
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v JOIN notification_vms n ON n.vm = v.id WHERE v.id = NEW.id;
END;

CREATE TRIGGER vms_notify_update AFTER UPDATE OF state ON vms
WHEN OLD.state IS NOT NEW.state
  AND NEW.state IN ('creating', 'ready', 'error', 'deleting', 'deleted')
  AND (SELECT enabled FROM notifier WHERE id = 1) = 1
BEGIN
    UPDATE vms SET notified_seq = notified_seq + 1 WHERE id = NEW.id;
    INSERT INTO notifications (vm, seq, event_type, payload, created_ms)
    SELECT v.id, v.notified_seq,
           CASE NEW.state
               WHEN 'creating' THEN 'gpu.vm.create.start'
               WHEN 'ready' THEN 'gpu.vm.create.end'
               WHEN 'error' THEN 'gpu.vm.create.error'
               WHEN 'deleting' THEN 'gpu.vm.delete.start'
               ELSE 'gpu.vm.delete.end'
           END,
           n.payload, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v JOIN notification_vms n ON n.vm = v.id WHERE v.id = NEW.id;
END;

-- An attach ending live, a re-home, a preemption beginning to take a cGPU back.
CREATE TRIGGER cgpus_notify_update AFTER UPDATE OF state, gpu, reclaimed_ms ON cgpus
WHEN ((OLD.state = 'attaching' AND NEW.state = 'live') OR OLD.gpu IS NOT NEW.gpu
      OR (OLD.reclaimed_ms IS NULL AND NEW.reclaimed_ms IS NOT NULL))
  AND (SELECT enabled FROM notifier WHERE id = 1) = 1
BEGIN
    UPDATE vms SET notified_seq = notified_seq + 1 WHERE id = NEW.vm;
    INSERT INTO notifications (vm, seq, event_type, payload, created_ms)
    SELECT v.id, v.notified_seq,
           CASE
               WHEN OLD.gpu IS NOT NEW.gpu THEN 'gpu.cgpu.rehome.end'
               WHEN OLD.reclaimed_ms IS NULL AND NEW.reclaimed_ms IS NOT NULL THEN 'gpu.vm.preempt'
               ELSE 'gpu.cgpu.attach.end'
           END,
           json_set(n.payload,
               '$.cgpu', json_object('index', NEW.idx, 'model', g.model,
                                     'memory_mib', NEW.memory_mib, 'mode', NEW.mode),
               '$.previous_model', CASE WHEN OLD.gpu IS NOT NEW.gpu
                   THEN (SELECT model FROM gpus WHERE id = OLD.gpu) END),
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v JOIN notification_vms n ON n.vm = v.id JOIN gpus g ON g.id = NEW.gpu
    WHERE v.id = NEW.vm;
END;

-- A detached cGPU released.
CREATE TRIGGER cgpus_notify_delete AFTER DELETE ON cgpus
WHEN OLD.state = 'detaching' AND (SELECT enabled FROM notifier WHERE id = 1) = 1
BEGIN
    UPDATE vms SET notified_seq = notified_seq + 1 WHERE id = OLD.vm;
    INSERT INTO notifications (vm, seq, event_type, payload, created_ms)
    SELECT v.id, v.notified_seq, 'gpu.cgpu.detach.end',
           json_set(n.payload, '$.cgpu', json_object('index', OLD.idx, 'model', g.model,
                                                      'memory_mib', OLD.memory_mib,
                                                      'mode', OLD.mode)),
           CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    FROM vms v JOIN notification_vms n ON n.vm = v.id JOIN gpus g ON g.id = OLD.gpu
    WHERE v.id = OLD.vm;
END;
