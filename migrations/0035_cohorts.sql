-- [5/5] cohorts: projects that lend each other the quota they do not use. A project is in one
-- cohort at most (its row's key); its terms (borrowing and lending limits per GPU resource, and
-- whether its requests borrow by default) are JSON, as gpgpums' `CohortTerms` writes them. A cGPU
-- admitted on loan (past its project's quota, on what the cohort lends) has the time of its loan,
-- by which the youngest loans are reclaimed first; NULL: not on loan (every cGPU booked before
-- cohorts, and by a replica of the previous version).
CREATE TABLE cohorts (
    name TEXT PRIMARY KEY,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE cohort_members (
    project TEXT PRIMARY KEY,
    cohort TEXT NOT NULL REFERENCES cohorts (name),
    terms TEXT NOT NULL
);
CREATE INDEX cohort_members_by_cohort ON cohort_members (cohort);
ALTER TABLE cgpus ADD COLUMN borrowed_ms BIGINT;
-- The queue's rounds read the cGPUs on loan; few are.
CREATE INDEX cgpus_on_loan ON cgpus (borrowed_ms) WHERE borrowed_ms IS NOT NULL;
