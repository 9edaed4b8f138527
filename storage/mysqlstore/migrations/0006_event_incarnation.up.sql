-- delayd's durable schema, version 6: task events carry the namespace
-- incarnation they happened in. Runs on MySQL 8 and MariaDB 10.11;
-- idempotent (the column is added only if it is missing, through
-- information_schema, since MySQL 8 has no ADD COLUMN IF NOT EXISTS).
--
-- incarnation is the namespace's create time (Unix ms) when the event was
-- made. GetTaskHistory reads only the live incarnation's events, so a
-- namespace re-created under a deleted one's name never reads the old
-- one's, and a group commit drops the events of an incarnation that
-- DropTasks has ended (delayd_namespace_born) or a later one replaced.
-- Rows from before this migration keep 0: no namespace incarnation reads
-- them; they are trimmed with the namespace's oldest events and deleted
-- with the namespace.
SET @delayd_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE delayd_task_events ADD COLUMN incarnation BIGINT NOT NULL DEFAULT 0 AFTER namespace',
  'DO 0') FROM information_schema.columns
  WHERE table_schema = DATABASE() AND table_name = 'delayd_task_events' AND column_name = 'incarnation');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;
