-- statements schema: created at start (idempotent).

-- shop is a merchant with its own time zone: its monthly statement covers
-- the calendar month in that zone and is run at 00:30 on the 1st there.
CREATE TABLE IF NOT EXISTS shop (
    id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    name       VARCHAR(255)    NOT NULL,
    time_zone  VARCHAR(64)     NOT NULL COMMENT 'IANA name, e.g. Europe/Berlin',
    closed_at  DATETIME(3)     NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- sale is what a statement sums.
CREATE TABLE IF NOT EXISTS sale (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    shop_id      BIGINT UNSIGNED NOT NULL,
    amount_cents BIGINT          NOT NULL,
    sold_at      DATETIME(3)     NOT NULL COMMENT 'UTC',
    KEY idx_shop_sold (shop_id, sold_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- statement is one shop's month: written once per (shop, period) however
-- often the month's firing is delivered (the unique key).
CREATE TABLE IF NOT EXISTS statement (
    shop_id     BIGINT UNSIGNED NOT NULL,
    period      CHAR(7)         NOT NULL COMMENT 'YYYY-MM in the shop''s zone',
    total_cents BIGINT          NOT NULL,
    sales       INT             NOT NULL,
    slot_at     DATETIME(3)     NOT NULL COMMENT 'the schedule slot that ran it (UTC)',
    created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (shop_id, period)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
