-- The outbox of one service, for PostgreSQL 9.5+ (FOR UPDATE SKIP LOCKED).
-- {{table}} is Config.Table; Outbox.Migrate runs this file, or copy it
-- (outbox.Schema prints it with the name filled in) into your own
-- migration tool. Statements are separated by ";" at the end of a line.

-- One row per Upsert or Remove a business transaction wrote; the relay
-- sends them in seq order per task and deletes what delayd accepted.
CREATE TABLE IF NOT EXISTS "{{table}}" (
  seq              BIGSERIAL PRIMARY KEY,
  namespace        VARCHAR(63) NOT NULL,
  task_id          VARCHAR(128) NOT NULL,
  op               SMALLINT NOT NULL,           -- 1 upsert, 2 remove
  kind             VARCHAR(128) NOT NULL DEFAULT '',
  payload          BYTEA NULL,
  due_ms           BIGINT NOT NULL DEFAULT 0,   -- Unix ms; upserts only
  created_us       BIGINT NOT NULL,             -- Unix µs when written
  park_incarnation BIGINT NULL,                 -- the parked task's version,
  park_generation  BIGINT NULL,                 -- once the relay parked it
  failed           BOOLEAN NOT NULL DEFAULT FALSE,
  last_error       VARCHAR(1024) NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS "{{table}}_task" ON "{{table}}" (namespace, task_id, seq);

-- One row per delivery an Once handler applied: its task's identity. The
-- primary key is what makes a redelivery a no-op.
CREATE TABLE IF NOT EXISTS "{{table}}_applied" (
  namespace   VARCHAR(63) NOT NULL,
  task_id     VARCHAR(128) NOT NULL,
  incarnation BIGINT NOT NULL,
  generation  BIGINT NOT NULL,
  applied_us  BIGINT NOT NULL,                  -- Unix µs; PruneApplied reads it
  PRIMARY KEY (namespace, task_id, incarnation, generation)
);
CREATE INDEX IF NOT EXISTS "{{table}}_applied_at" ON "{{table}}_applied" (applied_us);
