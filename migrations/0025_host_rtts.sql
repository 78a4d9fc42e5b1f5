-- [3/6] Round trips (microseconds) from a host to the GPU hosts its agent measures, as JSON
-- ({"gpu-host": 180}): the medians the agent last reported, kept when they moved enough to
-- matter to placement, and when they were (ms since the epoch; 0: never), which bounds how
-- often one host's measurements change the pool. '{}': none measured, as for every host
-- registered before.
ALTER TABLE hosts ADD COLUMN rtt_us TEXT NOT NULL DEFAULT '{}';
ALTER TABLE hosts ADD COLUMN rtt_recorded_ms BIGINT NOT NULL DEFAULT 0;
