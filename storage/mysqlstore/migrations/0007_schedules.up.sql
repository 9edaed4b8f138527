-- delayd's durable schema, version 7: schedules (recurring tasks). Runs on
-- MySQL 8 and MariaDB 10.11; idempotent.
--
-- One row per schedule. record is the schedule's definition and state as
-- storage.MarshalSchedule writes it (JSON; the payload template in base64),
-- so fields are added without a migration. version is bumped by every
-- write: an update names the version it read (compare-and-set), and a step
-- of the schedule loop updates the row and inserts the step's firings into
-- delayd_tasks in one transaction, so a slot becomes a task exactly once.
-- advance_ms is when the loop next looks at the schedule (0: never, while
-- paused or done); the loop reads the due ones by it.
CREATE TABLE IF NOT EXISTS delayd_schedules (
  namespace  VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  id         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  version    BIGINT NOT NULL,
  record     MEDIUMBLOB NOT NULL,
  advance_ms BIGINT NOT NULL DEFAULT 0,
  create_ms  BIGINT NOT NULL,
  update_ms  BIGINT NOT NULL,
  PRIMARY KEY (namespace, id),
  -- the schedule loop: the schedules due now, earliest first
  KEY delayd_schedules_advance (advance_ms)
) ENGINE=InnoDB;

-- A firing's first event (upserted) names its schedule and slot: two
-- columns of delayd_task_events, added only if missing (MySQL 8 has no ADD
-- COLUMN IF NOT EXISTS), '' and 0 for every other event.
SET @delayd_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE delayd_task_events ADD COLUMN schedule_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''', ADD COLUMN slot_ms BIGINT NOT NULL DEFAULT 0',
  'DO 0') FROM information_schema.columns
  WHERE table_schema = DATABASE() AND table_name = 'delayd_task_events' AND column_name = 'schedule_id');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;
