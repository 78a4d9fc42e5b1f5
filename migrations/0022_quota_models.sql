-- [3/6] A project's limits per GPU model, beside its totals (gpgpums' `Quota::models`, as JSON
-- by model name). NULL: none, as for every project's limits set before.
ALTER TABLE quotas ADD COLUMN models TEXT;
