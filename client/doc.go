// Package client is the Go SDK for delayd: a producer that schedules,
// reschedules and cancels delay tasks, and a consumer that receives them when
// they fall due.
//
// A producer needs three lines:
//
//	c, err := client.New("delayd.internal:7070", client.WithAPIKey(key))
//	...
//	_, err = c.Upsert(ctx, "orders", client.TaskSpec{
//		ID: "order-42", Kind: "order.close", When: client.After(15 * time.Minute),
//	})
//
// A consumer passes a handler to [Client.Consume]. A handler that returns nil
// acks the delivery (the task is done and deleted); one that returns an error
// or panics nacks it (delayd retries it later, after [RetryAfter]'s delay if
// the error carries one). Consume batches acks, extends the lease of slow
// handlers, reconnects when the stream breaks or the server drains, and on
// cancellation of its context lets running handlers finish and flushes their
// acks before it returns.
//
// Delivery is at-least-once: a handler may see the same task twice after a
// fault (a lease that ran out, a server or consumer crash). Make handlers
// idempotent, typically with a conditional UPDATE ... WHERE status = ?; see
// docs/client-guide.md.
//
// Conditional writes: [TaskSpec].CreateOnly schedules a task only if it does
// not exist yet (a retry after a timeout never moves its due time), and
// [TaskSpec].IfGeneration and [Client.RemoveIf] apply only at the generation
// the caller read (a renewal racing a cancellation cannot be lost). A write
// whose condition failed changed nothing; [ConflictOf] says what is stored.
// [Client.RemoveIDs] and [Client.RemoveMatching] cancel many tasks at once.
//
// Errors are gRPC status errors, possibly wrapped with the operation's name:
// use status.Code(err) to tell NotFound, InvalidArgument, ResourceExhausted,
// Unavailable... apart. The client retries Unavailable itself (bounded, with
// exponential backoff and jitter; see [WithRetry]), so an Unavailable that
// reaches the caller means the retries were used up.
//
// The package depends only on the generated delayd.v1 API, grpc and the
// google.rpc error details.
package client
