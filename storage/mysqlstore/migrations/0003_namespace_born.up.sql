-- delayd's durable schema, version 3: namespace incarnations survive a
-- delete. Runs on MySQL 8 and MariaDB 10.11; idempotent.
--
-- A namespace's create time is its incarnation: Subscribe streams and
-- cached policies are tied to it, so a namespace deleted and re-created by
-- someone else never serves the old one's streams. DeleteNamespace keeps
-- the deleted incarnation's create time here, and CreateNamespace of the
-- same name takes a later one even within the same millisecond (then
-- drops the row): the table holds only names deleted and not re-created.
CREATE TABLE IF NOT EXISTS delayd_namespace_born (
  name       VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  create_ms  BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB;
