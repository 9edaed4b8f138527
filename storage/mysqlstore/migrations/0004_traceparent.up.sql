-- delayd's durable schema, version 4: the trace context of a task's last
-- traced upsert. Runs on MySQL 8 and MariaDB 10.11; idempotent (the column
-- is added only if it is missing, through information_schema, since MySQL 8
-- has no ADD COLUMN IF NOT EXISTS).
--
-- traceparent is the W3C traceparent (55 ASCII characters today; room for
-- a longer future version) of the UpsertTask or BatchUpsertTasks call that
-- last wrote the row, '' when that call was not traced. It is written with
-- the row, so a task whose index is rebuilt from MySQL (Redis lost, a
-- reconciler repair) still delivers with its producer's trace context.
-- Rows from before this migration keep ''.
SET @delayd_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE delayd_tasks ADD COLUMN traceparent VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''' AFTER last_error',
  'DO 0') FROM information_schema.columns
  WHERE table_schema = DATABASE() AND table_name = 'delayd_tasks' AND column_name = 'traceparent');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;
