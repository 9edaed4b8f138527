package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/client/outbox"
)

// Loan states.
const (
	StatusApplied  = "APPLIED"
	StatusBorrowed = "BORROWED"
	StatusOverdue  = "OVERDUE"
	StatusReturned = "RETURNED"
)

// Errors the loan API answers with.
var (
	ErrNotFound   = errors.New("loan not found")
	ErrWrongState = errors.New("loan is not in a state that allows this")
)

// Loan is one row of borrow_order.
type Loan struct {
	ID        uint64     `json:"id"`
	UserID    uint64     `json:"user_id"`
	BookID    uint64     `json:"book_id"`
	Status    string     `json:"status"`
	BorrowAt  *time.Time `json:"borrow_at,omitempty"`
	DueAt     *time.Time `json:"due_at,omitempty"`
	Renewals  int        `json:"renewals"`
	OverdueAt *time.Time `json:"overdue_at,omitempty"`
	ReturnAt  *time.Time `json:"return_at,omitempty"`
}

// overduePayload is the overdue task's payload: the loan and the due date
// the task was scheduled for.
type overduePayload struct {
	LoanID  uint64 `json:"loan_id"`
	DueAtMs int64  `json:"due_at_ms"`
}

// Loans runs the loan state machine. MySQL holds the truth; delayd holds
// one "loan.overdue" task per borrowed book, due at its due date. Every
// delayd write is an outbox row in the loan's own transaction (a relay in
// the program sends it after the commit), so a rolled-back confirm or
// renewal schedules nothing and none of them waits for delayd.
type Loans struct {
	db        *sql.DB
	outbox    *outbox.Outbox
	namespace string
	period    time.Duration // loan period given at confirm
	renewBy   time.Duration // how far a renewal moves the due date
	logger    *slog.Logger

	// beforeOverdue, if set, runs first in every overdue delivery; an error
	// fails it. Tests use it to observe deliveries and stage races.
	beforeOverdue func(ctx context.Context, p overduePayload, d *client.Delivery) error
}

func taskID(loanID uint64) string { return "loan-" + strconv.FormatUint(loanID, 10) }

// dueTime rounds to what DATETIME(3) stores, so the due date in the payload
// and in the row compare equal.
func dueTime(t time.Time) time.Time { return t.Truncate(time.Millisecond).UTC() }

// overdueTask is the overdue task for a loan due at due.
func overdueTask(loanID uint64, due time.Time) outbox.Task {
	payload, _ := json.Marshal(overduePayload{LoanID: loanID, DueAtMs: due.UnixMilli()})
	return outbox.Task{ID: taskID(loanID), Kind: "loan.overdue", Payload: payload, DueAt: due}
}

// Apply records a loan request (APPLIED); nothing is scheduled yet.
func (l *Loans) Apply(ctx context.Context, userID, bookID uint64) (*Loan, error) {
	res, err := l.db.ExecContext(ctx, `INSERT INTO borrow_order (user_id, book_id, status) VALUES (?, ?, ?)`,
		userID, bookID, StatusApplied)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	id, _ := res.LastInsertId()
	return l.Get(ctx, uint64(id))
}

// Confirm hands the book out: BORROWED, due after the loan period, and
// schedules the overdue task at the due date, in the same transaction.
func (l *Loans) Confirm(ctx context.Context, id uint64) (*Loan, error) {
	due := dueTime(time.Now().Add(l.period))
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("confirm loan %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx,
		`UPDATE borrow_order SET status = ?, borrow_at = NOW(3), due_at = ? WHERE id = ? AND status = ?`,
		StatusBorrowed, due, id, StatusApplied)
	if err != nil {
		return nil, fmt.Errorf("confirm loan %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, l.whyNot(ctx, id)
	}
	if err := l.outbox.Upsert(ctx, tx, l.namespace, overdueTask(id, due)); err != nil {
		return nil, fmt.Errorf("confirm loan %d: schedule overdue: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("confirm loan %d: %w", id, err)
	}
	l.outbox.Wake()
	return l.Get(ctx, id)
}

// Renew moves the due date of a borrowed book renewBy further and, in the
// same transaction, upserts the overdue task with the new date. Once the
// relay sent it, the upsert has replaced the task (a new generation), so
// the old due date no longer fires; a delivery of the old date already in
// flight finds due_at changed and does nothing.
func (l *Loans) Renew(ctx context.Context, id uint64) (*Loan, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("renew loan %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	var due time.Time
	err = tx.QueryRowContext(ctx, `SELECT due_at FROM borrow_order WHERE id = ? AND status = ? FOR UPDATE`,
		id, StatusBorrowed).Scan(&due)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, l.whyNot(ctx, id)
	}
	if err != nil {
		return nil, fmt.Errorf("renew loan %d: %w", id, err)
	}
	due = dueTime(due.Add(l.renewBy))
	if _, err := tx.ExecContext(ctx, `UPDATE borrow_order SET due_at = ?, renewals = renewals + 1 WHERE id = ?`, due, id); err != nil {
		return nil, fmt.Errorf("renew loan %d: %w", id, err)
	}
	if err := l.outbox.Upsert(ctx, tx, l.namespace, overdueTask(id, due)); err != nil {
		return nil, fmt.Errorf("renew loan %d: reschedule overdue: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("renew loan %d: %w", id, err)
	}
	l.outbox.Wake()
	return l.Get(ctx, id)
}

// Return takes the book back (from BORROWED or OVERDUE) and, in the same
// transaction, removes the overdue task. Removing is an optimisation: an
// overdue delivery that still arrives finds the loan RETURNED and does
// nothing.
//
// The remove is unconditional on purpose, and ordered after any renewal:
// the outbox sends the rows of one task in the order they were written,
// and Renew holds the loan's row lock until it commits, so this UPDATE
// waits for it and the remove row comes after the renewal's. Once the loan
// is RETURNED, every version of the task is obsolete.
func (l *Loans) Return(ctx context.Context, id uint64) (*Loan, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("return loan %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx,
		`UPDATE borrow_order SET status = ?, return_at = NOW(3) WHERE id = ? AND status IN (?, ?)`,
		StatusReturned, id, StatusBorrowed, StatusOverdue)
	if err != nil {
		return nil, fmt.Errorf("return loan %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, l.whyNot(ctx, id)
	}
	if err := l.outbox.Remove(ctx, tx, l.namespace, taskID(id)); err != nil {
		return nil, fmt.Errorf("return loan %d: cancel overdue: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("return loan %d: %w", id, err)
	}
	l.outbox.Wake()
	return l.Get(ctx, id)
}

// Handler is the consumer of "loan.overdue" tasks: HandleOverdue run once
// per task version, in a transaction that also records the delivery
// (outbox.Once), so a consumer that dies after its commit and before its
// ack does not send a second notice.
func (l *Loans) Handler() client.Handler { return l.outbox.Once(l.HandleOverdue) }

// HandleOverdue marks the loan, in tx, BORROWED → OVERDUE with one overdue
// notice, if it is still borrowed with the due date this task was
// scheduled for. Anything else (returned, renewed) updates no row and
// acks. A database error rolls back and nacks, so delayd retries.
func (l *Loans) HandleOverdue(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
	var p overduePayload
	if err := json.Unmarshal(d.Payload, &p); err != nil || p.LoanID == 0 {
		l.logger.Error("overdue task with a bad payload; dropping it", "task", d.ID, "payload_bytes", len(d.Payload)) // never the payload: it may be large or private
		return nil
	}
	if l.beforeOverdue != nil {
		if err := l.beforeOverdue(ctx, p, d); err != nil {
			return err
		}
	}
	due := time.UnixMilli(p.DueAtMs).UTC()
	res, err := tx.ExecContext(ctx,
		`UPDATE borrow_order SET status = ?, overdue_at = NOW(3) WHERE id = ? AND status = ? AND due_at = ?`,
		StatusOverdue, p.LoanID, StatusBorrowed, due)
	if err != nil {
		return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO overdue_notice (loan_id, due_at) VALUES (?, ?)`, p.LoanID, due); err != nil {
			return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
		}
		l.logger.Info("loan overdue", "loan", p.LoanID, "due_at", due)
	}
	return nil
}

// Reconcile is the low-frequency safety net of the source design: it finds
// loans still BORROWED more than grace after their due date (their overdue
// task was lost, e.g. a store lost data, or rows were written by hand)
// and upserts their overdue task again through the outbox, at their due
// date, which is in the past, so delayd delivers it at once. The query
// uses idx_status_due and reads at most limit rows. It returns how many
// tasks it re-upserted.
//
// Re-upserting a task that was merely late is harmless: the handler's
// conditional UPDATE runs once whatever the number of deliveries.
func (l *Loans) Reconcile(ctx context.Context, grace time.Duration, limit int) (int, error) {
	rows, err := l.db.QueryContext(ctx,
		`SELECT id, due_at FROM borrow_order WHERE status = ? AND due_at < ? ORDER BY due_at LIMIT ?`,
		StatusBorrowed, time.Now().Add(-grace).UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	var tasks []outbox.Task
	for rows.Next() {
		var id uint64
		var due time.Time
		if err := rows.Scan(&id, &due); err != nil {
			rows.Close()
			return 0, fmt.Errorf("reconcile: %w", err)
		}
		tasks = append(tasks, overdueTask(id, dueTime(due)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	if len(tasks) == 0 {
		return 0, nil
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, task := range tasks {
		if err := l.outbox.Upsert(ctx, tx, l.namespace, task); err != nil {
			return 0, fmt.Errorf("reconcile: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	l.outbox.Wake()
	l.logger.Info("reconcile: re-upserted overdue tasks of loans past due and still borrowed", "tasks", len(tasks))
	return len(tasks), nil
}

// reconcileLoop runs Reconcile every interval until ctx ends.
func (l *Loans) reconcileLoop(ctx context.Context, every, grace time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Drain a backlog page by page; stop at a short page.
		for {
			n, err := l.Reconcile(ctx, grace, 500)
			if err != nil {
				l.logger.Warn("reconcile failed; next round retries", "error", err)
				break
			}
			if n < 500 {
				break
			}
		}
	}
}

// whyNot explains why a transition did not apply: no such loan, or a state
// that does not allow it.
func (l *Loans) whyNot(ctx context.Context, id uint64) error {
	_, err := l.Get(ctx, id)
	if err != nil {
		return err
	}
	return ErrWrongState
}

// Get returns one loan.
func (l *Loans) Get(ctx context.Context, id uint64) (*Loan, error) {
	var ln Loan
	var borrow, due, overdue, ret sql.NullTime
	err := l.db.QueryRowContext(ctx,
		`SELECT id, user_id, book_id, status, borrow_at, due_at, renewals, overdue_at, return_at FROM borrow_order WHERE id = ?`, id).
		Scan(&ln.ID, &ln.UserID, &ln.BookID, &ln.Status, &borrow, &due, &ln.Renewals, &overdue, &ret)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get loan %d: %w", id, err)
	}
	for _, f := range []struct {
		src sql.NullTime
		dst **time.Time
	}{{borrow, &ln.BorrowAt}, {due, &ln.DueAt}, {overdue, &ln.OverdueAt}, {ret, &ln.ReturnAt}} {
		if f.src.Valid {
			t := f.src.Time
			*f.dst = &t
		}
	}
	return &ln, nil
}
