-- [3/6] Where a host sits in the network: its group at each of the operator's levels (zone,
-- rack, switch), as JSON (gpgpums' `Topology`). Reported by its agent or stated by the
-- inventory; admins see it. '{}': none, as for every host registered before.
ALTER TABLE hosts ADD COLUMN topology TEXT NOT NULL DEFAULT '{}';
