-- [2/6] A VM's queue entries and events are added only together with a bump of its
-- `extras_version` (gsaasd's db/queue.rs `enqueue`, db/events.rs `insert_event`), and every write
-- of the VM returns it. A long-poll answered with the write that settled the VM, and a
-- termination, then know whether anything besides the VM was added since a read that found
-- nothing: a launch + terminate cycle read the queue and the events for nothing twice.
ALTER TABLE vms ADD COLUMN extras_version BIGINT NOT NULL DEFAULT 0;
