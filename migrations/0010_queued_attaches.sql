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
    attach TEXT,
    -- The head of the queue, as the last round planned it: 1, or 2 while capacity is being
    -- reclaimed for it; 0 for the others. Requests that do not wait pass it, or are held by it.
    head BIGINT NOT NULL DEFAULT 0
);
INSERT INTO queue_tickets (ticket, vm, project, priority, passed, enqueued_ms, deadline_ms, kind, attach, head)
    SELECT ticket, vm, project, priority, passed, enqueued_ms, deadline_ms, 'launch', NULL, 0 FROM queue;
DROP TABLE queue;
ALTER TABLE queue_tickets RENAME TO queue;
CREATE INDEX queue_by_vm ON queue (vm);
-- Finding the head must not scan a long queue: every launch looks for it.
CREATE INDEX queue_by_head ON queue (head);
