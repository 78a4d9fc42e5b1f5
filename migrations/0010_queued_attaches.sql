-- Attaches wait in the queue too: more cGPUs asked for by a running VM's owner ('attach'), and
-- the cGPUs a preemptible VM lost, to be given back ('give_back'). A VM may now hold several
-- tickets, so the table is rebuilt without its UNIQUE (vm).
CREATE TABLE queue_tickets (
    ticket BIGINT PRIMARY KEY,
    vm TEXT NOT NULL,
    project TEXT NOT NULL,
    priority BIGINT NOT NULL,
    passed BIGINT NOT NULL,
    enqueued_ms BIGINT NOT NULL,
    deadline_ms BIGINT,
    -- 'launch', 'attach' or 'give_back'.
    kind TEXT NOT NULL,
    -- For an attach or a give-back: what to attach (JSON).
    attach TEXT
);
INSERT INTO queue_tickets (ticket, vm, project, priority, passed, enqueued_ms, deadline_ms, kind, attach)
    SELECT ticket, vm, project, priority, passed, enqueued_ms, deadline_ms, 'launch', NULL FROM queue;
DROP TABLE queue;
ALTER TABLE queue_tickets RENAME TO queue;
CREATE INDEX queue_by_vm ON queue (vm);
