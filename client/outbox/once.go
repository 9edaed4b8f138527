package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/delayd/delayd/client"
)

// TxHandler handles one delivery inside the team's database transaction
// tx. Returning nil commits tx and acks the delivery; returning an error
// (or panicking) rolls tx back and nacks it. It must not commit or roll
// back tx itself.
type TxHandler func(ctx context.Context, tx *sql.Tx, d *client.Delivery) error

// Once turns h into a [client.Handler] whose effect is applied once per
// task version. For each delivery it begins a transaction, records the
// task's identity (namespace, id, incarnation, generation) in the applied
// table under its primary key, runs h in the same transaction and commits;
// then Consume acks. A delivery whose identity is already recorded (the
// consumer committed and died before its ack, or a lease ran out while the
// handler ran) is acked without running h. Two deliveries of the same
// version at once wait for each other on the key: one applies, the other
// is acked.
//
// A task upserted again (a new generation) or created again (a new
// incarnation) is a new version, and runs h again: that is a new event.
//
// The applied table grows by one row per delivery applied; delete old
// rows with [Outbox.PruneApplied].
func (o *Outbox) Once(h TxHandler) client.Handler {
	return func(ctx context.Context, d *client.Delivery) (err error) {
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("outbox once: begin: %w", err)
		}
		committed := false
		defer func() {
			if !committed {
				_ = tx.Rollback()
			}
		}()
		res, err := tx.ExecContext(ctx, o.q.applyInsert, d.Namespace, d.ID, d.Incarnation, d.Generation, o.cfg.Now().UnixMicro())
		if err != nil {
			return fmt.Errorf("outbox once: record %s/%s: %w", d.Namespace, d.ID, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("outbox once: record %s/%s: %w", d.Namespace, d.ID, err)
		}
		if n == 0 {
			return nil // applied before: ack without running h again
		}
		if err := h(ctx, tx, d); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("outbox once: commit %s/%s: %w", d.Namespace, d.ID, err)
		}
		committed = true
		o.at("once-committed")
		return nil
	}
}

// PruneApplied deletes the applied records older than before and returns
// how many it deleted. A record is needed only until its delivery is acked
// (and any copy of it could still arrive: a lease running out while the
// handler ran), so keeping a day or more is plenty.
func (o *Outbox) PruneApplied(ctx context.Context, before time.Time) (int64, error) {
	res, err := o.db.ExecContext(ctx, o.q.pruneApplied, before.UnixMicro())
	if err != nil {
		return 0, fmt.Errorf("outbox prune applied: %w", err)
	}
	return res.RowsAffected()
}
