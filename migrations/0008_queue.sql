-- Launches waiting for capacity (VMs in state 'queued'), one ticket each, numbered in arrival
-- order. The planner (gpgpums::queue) orders them by priority, fair share and ticket.
CREATE TABLE queue (
    ticket BIGINT PRIMARY KEY,
    vm TEXT NOT NULL UNIQUE,
    project TEXT NOT NULL,
    priority BIGINT NOT NULL,
    -- How many launches started ahead of it while it was the head of the queue.
    passed BIGINT NOT NULL,
    enqueued_ms BIGINT NOT NULL,
    -- When it ends with queue_timeout; NULL: never.
    deadline_ms BIGINT
);
