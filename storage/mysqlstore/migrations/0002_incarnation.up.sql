-- delayd's durable schema, version 2: task incarnations and the update
-- watermark. Runs on MySQL 8 and MariaDB 10.11; idempotent (each change is
-- made only if it is missing, through information_schema, since MySQL 8 has
-- no ADD COLUMN IF NOT EXISTS).
--
-- incarnation names one life of (namespace, id): set when the row is
-- created, kept by every upsert that replaces it; a task re-created after a
-- remove or an ack gets a larger one (see storage.Task.Incarnation). The
-- index and every delivery token carry it, and (incarnation, generation)
-- orders a task's versions in both stores. Rows from before this migration
-- keep 0, as the Redis index's converted records do, so both stores agree.
SET @delayd_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE delayd_tasks ADD COLUMN incarnation BIGINT NOT NULL DEFAULT 0 AFTER generation',
  'DO 0') FROM information_schema.columns
  WHERE table_schema = DATABASE() AND table_name = 'delayd_tasks' AND column_name = 'incarnation');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;

-- The reconciler's incremental pass reads the rows changed since its last
-- pass by update_ms, with the version it compares, from this index alone.
SET @delayd_ddl = (SELECT IF(COUNT(*) = 0,
  'ALTER TABLE delayd_tasks ADD KEY delayd_tasks_updated (update_ms, incarnation, generation)',
  'DO 0') FROM information_schema.statistics
  WHERE table_schema = DATABASE() AND table_name = 'delayd_tasks' AND index_name = 'delayd_tasks_updated');
PREPARE delayd_stmt FROM @delayd_ddl;
EXECUTE delayd_stmt;
DEALLOCATE PREPARE delayd_stmt;
