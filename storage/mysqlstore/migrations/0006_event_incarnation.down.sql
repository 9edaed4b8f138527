-- Reverts 0006_event_incarnation (for an operator going back to schema
-- version 5 on purpose; delayd never runs down migrations itself).
ALTER TABLE delayd_task_events DROP COLUMN incarnation;
