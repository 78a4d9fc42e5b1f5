-- VM lists page newest first by (created_ms, id): one project's through vms_by_project, every
-- project's (admins) through vms_by_created, each read in index order whatever the table's size.
DROP INDEX vms_by_project;
CREATE INDEX vms_by_project ON vms (project, created_ms, id);
CREATE INDEX vms_by_created ON vms (created_ms, id);
