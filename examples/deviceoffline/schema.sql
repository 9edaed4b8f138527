-- deviceoffline schema: created at start (idempotent).

-- equipment_info is the authority for a device's state. heartbeat_seq
-- counts heartbeats; the offline task carries the seq of the heartbeat that
-- scheduled it, and only that heartbeat's task may mark the device offline.
--   (new) --heartbeat--> ONLINE --no heartbeat for offline-after--> OFFLINE
--                        OFFLINE --heartbeat--> ONLINE (maintenance row recovered)
CREATE TABLE IF NOT EXISTS equipment_info (
    equipment_id      VARCHAR(64)     NOT NULL PRIMARY KEY,
    status            VARCHAR(16)     NOT NULL COMMENT 'ONLINE / OFFLINE',
    heartbeat_seq     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    last_heartbeat_at DATETIME(3)     NULL,
    offline_at        DATETIME(3)     NULL,
    updated_at        DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- equipment_maintain is the maintenance ticket written when a device goes
-- offline, closed (recovered_at) when it is heard from again.
CREATE TABLE IF NOT EXISTS equipment_maintain (
    id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    equipment_id   VARCHAR(64)     NOT NULL,
    failure_reason VARCHAR(64)     NOT NULL,
    failure_time   DATETIME(3)     NOT NULL,
    heartbeat_seq  BIGINT UNSIGNED NOT NULL COMMENT 'the last heartbeat before the silence',
    recovered_at   DATETIME(3)     NULL,
    UNIQUE KEY uk_device_seq (equipment_id, heartbeat_seq),
    KEY idx_device_open (equipment_id, recovered_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
