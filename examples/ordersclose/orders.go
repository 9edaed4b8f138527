package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/client/outbox"
)

// Order states.
const (
	StatusWaitPay = "WAIT_PAY"
	StatusPaid    = "PAID"
	StatusClosed  = "CLOSED"
)

// Errors the order API answers with.
var (
	ErrNotFound    = errors.New("order not found")
	ErrOrderClosed = errors.New("order already closed: the payment must be refunded")
)

// Order is one row of the orders table.
type Order struct {
	ID          uint64     `json:"id"`
	AmountCents int64      `json:"amount_cents"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"created_at"`
	PaidAt      *time.Time `json:"paid_at,omitempty"`
	ClosedAt    *time.Time `json:"closed_at,omitempty"`
}

// Orders creates, pays and closes orders. MySQL holds the truth; delayd
// holds one "close" task per unpaid order and pushes it when the order's
// payment window ends. Every delayd write goes through the outbox, in the
// order's own transaction: an order that rolls back schedules nothing, one
// that commits gets its close task even if delayd is down at that moment
// (the relay sends it when delayd is back), and creating or paying an order
// never waits for delayd.
type Orders struct {
	db         *sql.DB
	outbox     *outbox.Outbox
	namespace  string
	closeAfter time.Duration
	logger     *slog.Logger

	// beforeClose, if set, runs first in every close attempt; an error fails
	// the attempt. Tests use it to inject failures and races.
	beforeClose func(ctx context.Context, orderID uint64, attempt int32) error
}

// taskID is the delayd task id of an order's close task: the order id
// itself, so paying needs nothing but the order id to cancel it.
func taskID(orderID uint64) string { return "order-" + strconv.FormatUint(orderID, 10) }

// Create inserts an order waiting for payment and, in the same
// transaction, the outbox row that schedules its close closeAfter from now.
// The due time is fixed here, at the order's creation: a relay that sends
// the row late (delayd was down) or twice does not move it.
func (o *Orders) Create(ctx context.Context, amountCents int64) (*Order, error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("create order: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (amount_cents, status) VALUES (?, ?)`, amountCents, StatusWaitPay)
	if err != nil {
		return nil, fmt.Errorf("create order: %w", err)
	}
	id64, err := res.LastInsertId()
	if err != nil {
		return nil, fmt.Errorf("create order: %w", err)
	}
	id := uint64(id64)
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_events (order_id, event) VALUES (?, 'CREATED')`, id); err != nil {
		return nil, fmt.Errorf("create order: %w", err)
	}
	if err := o.outbox.Upsert(ctx, tx, o.namespace, outbox.Task{
		ID:      taskID(id),
		Kind:    "order.close",
		Payload: []byte(strconv.FormatUint(id, 10)),
		DueAt:   time.Now().Add(o.closeAfter),
	}); err != nil {
		return nil, fmt.Errorf("create order: schedule close: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("create order: %w", err)
	}
	o.outbox.Wake()
	return o.Get(ctx, id)
}

// Pay marks an order paid and cancels its close, in one transaction. Paying
// a paid order again is a no-op (payment callbacks are retried); paying a
// closed order is ErrOrderClosed.
//
// The payment and the close race on the same row: both are conditional
// UPDATEs on status = 'WAIT_PAY', so exactly one of them changes it. A
// close that still fires (it was in flight) finds the order PAID and does
// nothing.
func (o *Orders) Pay(ctx context.Context, id uint64) error {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pay order %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx,
		`UPDATE orders SET status = ?, paid_at = NOW(3) WHERE id = ? AND status = ?`, StatusPaid, id, StatusWaitPay)
	if err != nil {
		return fmt.Errorf("pay order %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var status string
		err := tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ?`, id).Scan(&status)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return ErrNotFound
		case err != nil:
			return fmt.Errorf("pay order %d: %w", id, err)
		case status == StatusClosed:
			return ErrOrderClosed
		}
		return nil // already paid
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO order_events (order_id, event) VALUES (?, 'PAID')`, id); err != nil {
		return fmt.Errorf("pay order %d: %w", id, err)
	}
	if err := o.outbox.Remove(ctx, tx, o.namespace, taskID(id)); err != nil {
		return fmt.Errorf("pay order %d: cancel close: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pay order %d: %w", id, err)
	}
	o.outbox.Wake()
	return nil
}

// Handler is the consumer of "order.close" tasks: HandleClose run once per
// task version, inside a transaction that also records the delivery
// (outbox.Once), so a consumer that dies after its commit and before its
// ack does not close the order, or release its stock, a second time.
func (o *Orders) Handler() client.Handler { return o.outbox.Once(o.HandleClose) }

// HandleClose closes the order, in tx, if it is still waiting for payment;
// a close that lost the race to a payment updates no row. A database error
// returns the error, so the transaction rolls back and delayd retries the
// close after its backoff.
func (o *Orders) HandleClose(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
	id, err := strconv.ParseUint(string(d.Payload), 10, 64)
	if err != nil {
		// A malformed task will never succeed: log it and ack it.
		o.logger.Error("close task with a bad payload; dropping it", "task", d.ID, "payload_bytes", len(d.Payload)) // never the payload: it may be large or private
		return nil
	}
	if o.beforeClose != nil {
		if err := o.beforeClose(ctx, id, d.Attempt); err != nil {
			return err
		}
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE orders SET status = ?, closed_at = NOW(3) WHERE id = ? AND status = ?`, StatusClosed, id, StatusWaitPay)
	if err != nil {
		return fmt.Errorf("close order %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		// Release stock, void coupons... in the same transaction.
		if _, err := tx.ExecContext(ctx, `INSERT INTO order_events (order_id, event) VALUES (?, 'CLOSED')`, id); err != nil {
			return fmt.Errorf("close order %d: %w", id, err)
		}
		o.logger.Info("order closed: not paid in time", "order", id, "attempt", d.Attempt)
	}
	return nil
}

// Get returns one order.
func (o *Orders) Get(ctx context.Context, id uint64) (*Order, error) {
	var ord Order
	var paid, closed sql.NullTime
	err := o.db.QueryRowContext(ctx,
		`SELECT id, amount_cents, status, created_at, paid_at, closed_at FROM orders WHERE id = ?`, id).
		Scan(&ord.ID, &ord.AmountCents, &ord.Status, &ord.CreatedAt, &paid, &closed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get order %d: %w", id, err)
	}
	if paid.Valid {
		ord.PaidAt = &paid.Time
	}
	if closed.Valid {
		ord.ClosedAt = &closed.Time
	}
	return &ord, nil
}
