-- Reverts 0004_traceparent (for an operator going back to schema version 3
-- on purpose; delayd never runs down migrations itself).
ALTER TABLE delayd_tasks DROP COLUMN traceparent;
