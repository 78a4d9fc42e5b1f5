-- [3/6] Round trips (microseconds) from a host to the GPU hosts its agent measures, as JSON
-- ({"gpu-host": 180}): the medians the agent last reported, kept when they moved enough to
-- matter to placement. '{}': none measured, as for every host registered before.
ALTER TABLE hosts ADD COLUMN rtt_us TEXT NOT NULL DEFAULT '{}';
