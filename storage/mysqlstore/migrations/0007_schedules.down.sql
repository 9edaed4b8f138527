DROP TABLE IF EXISTS delayd_schedules;
SET @delayd_ddl = (SELECT IF(COUNT(*) = 1,
  'ALTER TABLE delayd_task_events DROP COLUMN schedule_id, DROP COLUMN slot_ms',
  'DO 0') FROM information_schema.columns
  WHERE table_schema = DATABASE() AND table_name = 'delayd_task_events' AND column_name = 'schedule_id');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;
