-- Reverts 0002_incarnation (for an operator going back to schema version 1
-- on purpose; delayd never runs down migrations itself).
ALTER TABLE delayd_tasks DROP KEY delayd_tasks_updated;
ALTER TABLE delayd_tasks DROP COLUMN incarnation;
