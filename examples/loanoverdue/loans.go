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
// one "loan.overdue" task per borrowed book, due at its due date.
type Loans struct {
	db        *sql.DB
	delayd    *client.Client
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

// overdueSpec is the overdue task for a loan due at due.
func overdueSpec(loanID uint64, due time.Time) client.TaskSpec {
	payload, _ := json.Marshal(overduePayload{LoanID: loanID, DueAtMs: due.UnixMilli()})
	return client.TaskSpec{ID: taskID(loanID), Kind: "loan.overdue", Payload: payload, When: client.At(due)}
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
// schedules the overdue task at the due date. The task is upserted before
// the transaction commits: if that fails the confirm fails as a whole;
// if the commit fails after it, the task finds no BORROWED loan with that
// due date and does nothing.
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
	if _, err := l.delayd.Upsert(ctx, l.namespace, overdueSpec(id, due)); err != nil {
		return nil, fmt.Errorf("confirm loan %d: schedule overdue: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("confirm loan %d: %w", id, err)
	}
	return l.Get(ctx, id)
}

// Renew moves the due date of a borrowed book renewBy further and upserts
// the overdue task with the new date. The upsert replaces the task (a new
// generation), so the old due date never fires; a delivery of the old date
// already in flight finds due_at changed and does nothing.
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
	if _, err := l.delayd.Upsert(ctx, l.namespace, overdueSpec(id, due)); err != nil {
		return nil, fmt.Errorf("renew loan %d: reschedule overdue: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("renew loan %d: %w", id, err)
	}
	return l.Get(ctx, id)
}

// Return takes the book back (from BORROWED or OVERDUE) and removes the
// overdue task. Removing is an optimisation: an overdue delivery that still
// arrives finds the loan RETURNED and does nothing.
//
// The remove is unconditional on purpose. A renewal that races the return
// is ordered by the loan's row: Renew holds the row lock across its upsert,
// so this UPDATE waits for it and the remove comes after the renewed task
// was written. Once the loan is RETURNED, every version of the task is
// obsolete; a RemoveIf of the generation this call saw would only leave a
// renewed task behind to fire for nothing.
func (l *Loans) Return(ctx context.Context, id uint64) (*Loan, error) {
	res, err := l.db.ExecContext(ctx,
		`UPDATE borrow_order SET status = ?, return_at = NOW(3) WHERE id = ? AND status IN (?, ?)`,
		StatusReturned, id, StatusBorrowed, StatusOverdue)
	if err != nil {
		return nil, fmt.Errorf("return loan %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, l.whyNot(ctx, id)
	}
	if _, err := l.delayd.Remove(ctx, l.namespace, taskID(id)); err != nil {
		l.logger.Warn("returned loan's overdue task not removed; it will fire and do nothing", "loan", id, "error", err)
	}
	return l.Get(ctx, id)
}

// HandleOverdue is the delayd handler for "loan.overdue" tasks: BORROWED →
// OVERDUE, and one overdue notice, if the loan is still borrowed with the
// due date this task was scheduled for. Anything else (returned, renewed,
// a duplicate delivery) updates no row and acks. A database error nacks, so
// delayd retries.
func (l *Loans) HandleOverdue(ctx context.Context, d *client.Delivery) error {
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
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx,
		`UPDATE borrow_order SET status = ?, overdue_at = NOW(3) WHERE id = ? AND status = ? AND due_at = ?`,
		StatusOverdue, p.LoanID, StatusBorrowed, due)
	if err != nil {
		return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
	}
	n, _ := res.RowsAffected()
	if n == 1 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO overdue_notice (loan_id, due_at) VALUES (?, ?)`, p.LoanID, due); err != nil {
			return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mark loan %d overdue: %w", p.LoanID, err)
	}
	if n == 1 {
		l.logger.Info("loan overdue", "loan", p.LoanID, "due_at", due)
	}
	return nil
}

// Reconcile is the low-frequency safety net of the source design: it finds
// loans still BORROWED more than grace after their due date (their overdue
// task was lost, e.g. the upsert failed after a commit or a store lost
// data) and upserts their overdue task again, at their due date, which is
// in the past, so delayd delivers it at once. The query uses
// idx_status_due and reads at most limit rows. It returns how many tasks
// it re-upserted.
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
	var specs []client.TaskSpec
	for rows.Next() {
		var id uint64
		var due time.Time
		if err := rows.Scan(&id, &due); err != nil {
			rows.Close()
			return 0, fmt.Errorf("reconcile: %w", err)
		}
		specs = append(specs, overdueSpec(id, dueTime(due)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	if len(specs) == 0 {
		return 0, nil
	}
	results, err := l.delayd.BatchUpsert(ctx, l.namespace, specs)
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	n := 0
	for i, r := range results {
		if r.Err != nil {
			l.logger.Warn("reconcile: overdue task not re-upserted", "task", specs[i].ID, "error", r.Err)
			continue
		}
		n++
	}
	l.logger.Info("reconcile: re-upserted overdue tasks of loans past due and still borrowed", "tasks", n)
	return n, nil
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
