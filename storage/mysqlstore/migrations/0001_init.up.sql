-- delayd's durable schema, version 1. Runs on MySQL 8 and MariaDB 10.11.
--
-- Conventions: times are BIGINT Unix milliseconds (columns end in _ms; 0 =
-- unset), so no time zone or DATETIME precision differs between servers.
-- Names and ids are ASCII (validated before they get here) with binary
-- collation, so comparisons are exact and case-sensitive. Every statement is
-- idempotent (IF NOT EXISTS): re-running this file changes nothing.

-- delayd_tasks: the authority for every task that is not yet acked.
-- state: 1 = scheduled, 3 = dead (storage.State values). A delivery is not
-- written here (pops stay in Redis only), so a delivered task reads as
-- scheduled with the due time it was delivered at; after a Redis loss it is
-- delivered again.
CREATE TABLE IF NOT EXISTS delayd_tasks (
  namespace  VARCHAR(63)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  id         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  kind       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  payload    MEDIUMBLOB NOT NULL,
  due_ms     BIGINT NOT NULL,
  state      TINYINT UNSIGNED NOT NULL,
  -- bumped by every upsert; decided here, copied into the index
  generation BIGINT NOT NULL,
  -- deliveries so far, as of the last nack, lease expiry, death or requeue
  attempt    INT NOT NULL DEFAULT 0,
  last_error VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  create_ms  BIGINT NOT NULL,
  update_ms  BIGINT NOT NULL,
  dead_ms    BIGINT NOT NULL DEFAULT 0,
  -- the reconciler and the index rebuild walk this key in bounded batches
  PRIMARY KEY (namespace, id),
  -- ListTasks fallback (scheduled in due order, dead letters) and stats
  KEY delayd_tasks_state_due (namespace, state, due_ms)
) ENGINE=InnoDB;

-- delayd_task_history: acked tasks, kept only when history retention is
-- configured; rows older than the retention are pruned by the reconciler
-- leader in bounded batches.
CREATE TABLE IF NOT EXISTS delayd_task_history (
  seq        BIGINT NOT NULL AUTO_INCREMENT,
  namespace  VARCHAR(63)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  id         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  kind       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  payload    MEDIUMBLOB NOT NULL,
  due_ms     BIGINT NOT NULL,
  generation BIGINT NOT NULL,
  attempt    INT NOT NULL,
  create_ms  BIGINT NOT NULL,
  acked_ms   BIGINT NOT NULL,
  PRIMARY KEY (seq),
  KEY delayd_task_history_task (namespace, id),
  KEY delayd_task_history_acked (acked_ms)
) ENGINE=InnoDB;

-- delayd_namespaces: the namespace registry. policy is the JSON document of
-- storage.MarshalPolicy (zero fields omitted = server default); version
-- increases with every update (optimistic concurrency).
CREATE TABLE IF NOT EXISTS delayd_namespaces (
  name       VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  policy     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  version    BIGINT NOT NULL DEFAULT 1,
  create_ms  BIGINT NOT NULL,
  update_ms  BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB;

-- delayd_api_keys: API keys, never their secrets: hash is the SHA-256 of the
-- secret. namespace '*' is a global key. scopes is a comma-separated list of
-- scope names (produce, consume, admin).
CREATE TABLE IF NOT EXISTS delayd_api_keys (
  id          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace   VARCHAR(63)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  scopes      VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  description VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
  hash        VARBINARY(64) NOT NULL,
  create_ms   BIGINT NOT NULL,
  PRIMARY KEY (id),
  KEY delayd_api_keys_namespace (namespace, create_ms)
) ENGINE=InnoDB;
