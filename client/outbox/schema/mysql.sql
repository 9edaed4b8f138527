-- The outbox of one service, for MySQL 8 and MariaDB 10.6+ (both have
-- FOR UPDATE SKIP LOCKED). {{table}} is Config.Table; Outbox.Migrate runs
-- this file, or copy it (outbox.Schema prints it with the name filled in)
-- into your own migration tool. Statements are separated by ";" at the end
-- of a line.

-- One row per Upsert or Remove a business transaction wrote; the relay
-- sends them in seq order per task and deletes what delayd accepted.
-- namespace and task_id are ASCII with a binary collation: task ids are
-- case-sensitive.
CREATE TABLE IF NOT EXISTS `{{table}}` (
  seq              BIGINT NOT NULL AUTO_INCREMENT,
  namespace        VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  task_id          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  op               TINYINT NOT NULL,            -- 1 upsert, 2 remove
  kind             VARCHAR(128) NOT NULL DEFAULT '',
  payload          MEDIUMBLOB NULL,
  due_ms           BIGINT NOT NULL DEFAULT 0,    -- Unix ms; upserts only
  created_us       BIGINT NOT NULL,              -- Unix µs when written
  park_incarnation BIGINT NULL,                  -- the parked task's version,
  park_generation  BIGINT NULL,                  -- once the relay parked it
  failed           BOOLEAN NOT NULL DEFAULT FALSE,
  last_error       VARCHAR(1024) NOT NULL DEFAULT '',
  PRIMARY KEY (seq),
  KEY `{{table}}_task` (namespace, task_id, seq)
) ENGINE=InnoDB;

-- One row per delivery an Once handler applied: its task's identity. The
-- primary key is what makes a redelivery a no-op.
CREATE TABLE IF NOT EXISTS `{{table}}_applied` (
  namespace   VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  task_id     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  incarnation BIGINT NOT NULL,
  generation  BIGINT NOT NULL,
  applied_us  BIGINT NOT NULL,                   -- Unix µs; PruneApplied reads it
  PRIMARY KEY (namespace, task_id, incarnation, generation),
  KEY `{{table}}_applied_at` (applied_us)
) ENGINE=InnoDB;
