-- [1/6] A barrier holds for a bounded time: since when the head of the queue holds other
-- projects' requests back (NULL: it does not). After queue.max_hold_secs its project stops
-- holding, and its requests' passes start again from zero.
ALTER TABLE queue ADD COLUMN holding_since_ms BIGINT;
