-- delayd's durable schema, version 5: task events (GetTaskHistory), kept
-- for the namespaces whose policy sets history_retention_bytes. Runs on
-- MySQL 8 and MariaDB 10.11; idempotent.
--
-- One row per event, written in the same group-commit transactions as the
-- tasks' own writes. seq orders them (a task's events in the order they
-- were written); event_ms is the store's clock (the Redis index's, as
-- due_ms). Zero columns are the fields an event kind does not carry. Each
-- namespace is trimmed to its cap (retention bytes / 128 rows) in bounded
-- deletes by the replicas that write it. delayd_task_history (version 1)
-- is another thing: copies of acked tasks, kept for a server-wide time.
CREATE TABLE IF NOT EXISTS delayd_task_events (
  seq            BIGINT NOT NULL AUTO_INCREMENT,
  namespace      VARCHAR(63)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  id             VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  event_ms       BIGINT NOT NULL,
  -- storage.EventKind: 1 upserted, 2 rescheduled, 3 delivered, 4 nacked,
  -- 5 lease expired, 6 dead-lettered, 7 requeued, 8 removed, 9 acked
  kind           TINYINT UNSIGNED NOT NULL,
  key_id         VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  generation     BIGINT NOT NULL DEFAULT 0,
  due_ms         BIGINT NOT NULL DEFAULT 0,
  attempt        INT NOT NULL DEFAULT 0,
  replica        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  lateness_ms    BIGINT NOT NULL DEFAULT 0,
  reason         VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  retry_after_ms BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (seq),
  -- GetTaskHistory: one task's events in order, no scan
  KEY delayd_task_events_task (namespace, id, seq),
  -- trimming a namespace to its cap
  KEY delayd_task_events_ns (namespace, seq)
) ENGINE=InnoDB;
