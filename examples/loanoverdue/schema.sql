-- loanoverdue schema: created at start (idempotent).

-- borrow_order is the authority for a loan. delayd holds one "overdue"
-- task per borrowed book, due at due_at; the handler's conditional UPDATE
-- decides whether it still applies.
--   APPLIED --confirm--> BORROWED --return--> RETURNED
--                        BORROWED --due task--> OVERDUE --return--> RETURNED
--                        BORROWED --renew--> BORROWED (due_at moves)
CREATE TABLE IF NOT EXISTS borrow_order (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    user_id    BIGINT UNSIGNED NOT NULL,
    book_id    BIGINT UNSIGNED NOT NULL,
    status     VARCHAR(16)     NOT NULL COMMENT 'APPLIED / BORROWED / OVERDUE / RETURNED',
    borrow_at  DATETIME(3)     NULL,
    due_at     DATETIME(3)     NULL COMMENT 'the due date the overdue task is scheduled for',
    renewals   INT             NOT NULL DEFAULT 0,
    overdue_at DATETIME(3)     NULL,
    return_at  DATETIME(3)     NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    -- The reconciliation query (status = 'BORROWED' AND due_at < ?) uses it.
    KEY idx_status_due (status, due_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- overdue_notice is what marking a loan overdue triggers (an SMS, a fine):
-- one row per loan that actually became overdue.
CREATE TABLE IF NOT EXISTS overdue_notice (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    loan_id    BIGINT UNSIGNED NOT NULL,
    due_at     DATETIME(3)     NOT NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    UNIQUE KEY uk_loan_due (loan_id, due_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
