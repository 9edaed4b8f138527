// Package outbox makes delayd writes part of the team's own database
// transactions (MySQL/MariaDB or PostgreSQL, through database/sql), and
// applies each delivery's effect once.
//
// Producer. Upsert and Remove take the caller's *sql.Tx and write a row to
// the outbox table in that transaction: if the transaction rolls back, no
// task is ever scheduled; if it commits, the task reaches delayd even when
// delayd is down at that moment. A relay (Start, in the service's own
// process) sends committed rows in per-task order as batch calls and
// deletes what delayd accepted:
//
//	ob, _ := outbox.New(db, outbox.Config{Dialect: outbox.MySQL, Client: c})
//	_ = ob.Migrate(ctx)           // or run outbox.Schema in your migrations
//	_ = ob.Start(ctx)             // the relay; ob.Stop(ctx) at exit
//
//	tx, _ := db.BeginTx(ctx, nil)
//	tx.ExecContext(ctx, "INSERT INTO orders ...")
//	ob.Upsert(ctx, tx, "orders", outbox.Task{ID: "order-42", DueAt: time.Now().Add(15 * time.Minute)})
//	tx.Commit()
//	ob.Wake() // optional: send now rather than at the next poll
//
// Several relays (replicas of the service) share one table: each claims
// the oldest unsent row of each task with FOR UPDATE SKIP LOCKED, so a row
// is sent by one of them at a time and the rows of one task in order. A
// relay that dies between sending a row and deleting it leaves the row for
// the next one, which sends it again; every call is made so that sending
// it again has no second effect (an upsert is parked, recorded, then armed
// with if_generation; see relay.go), at the cost of two delayd writes per
// upserted row.
//
// Consumer. Once wraps a handler that runs inside a transaction of the
// team's database: it records the delivery's task identity (namespace,
// id, incarnation, generation) under a unique key in that transaction, so a
// redelivery of a version already applied (a consumer that died after its
// commit and before its ack) is acked without running the handler again.
//
//	c.Consume(ctx, "orders", ob.Once(func(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
//		_, err := tx.ExecContext(ctx, "UPDATE orders SET status='CLOSED' WHERE id=? AND status='WAIT_PAY'", d.ID)
//		return err
//	}), client.ConsumeOptions{})
//
// Limits: one database for the outbox and the business data (that is the
// point); a relay's database connection that breaks while its park call is
// still on the way to delayd can, in the worst case, leave that task parked
// (ParkFor late) after another relay armed it. docs/client-guide.md says
// when the outbox is worth its cost, with measured figures.
package outbox
