-- The twin of 0032_usage_one_instant.postgres.sql, which makes PostgreSQL's update triggers log
-- a row's events at one instant. Nothing changes here: SQLite's clock ('now') stands still within
-- a statement, so 0029's triggers already log one change's events at one instant.
SELECT 1;
