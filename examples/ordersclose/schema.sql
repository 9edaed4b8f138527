-- ordersclose schema: created at start (idempotent).

-- orders is the authority for an order's state. The close task in delayd
-- only says "look at order N now"; the conditional UPDATEs below decide.
--   WAIT_PAY --pay--> PAID
--   WAIT_PAY --close task due--> CLOSED
CREATE TABLE IF NOT EXISTS orders (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    amount_cents BIGINT          NOT NULL,
    status       VARCHAR(16)     NOT NULL COMMENT 'WAIT_PAY / PAID / CLOSED',
    created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    paid_at      DATETIME(3)     NULL,
    closed_at    DATETIME(3)     NULL,
    KEY idx_status_created (status, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- order_events is an append-only log of transitions: one row per change
-- that actually happened, so a duplicate delivery shows up as "no row".
CREATE TABLE IF NOT EXISTS order_events (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id   BIGINT UNSIGNED NOT NULL,
    event      VARCHAR(16)     NOT NULL COMMENT 'CREATED / PAID / CLOSED',
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    KEY idx_order (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
