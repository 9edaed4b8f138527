package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
)

// These examples need a delayd at localhost:7070 (`make run`), so they are
// compiled but not run by `go test`.

// A producer schedules "close order 42 in 15 minutes" and cancels it when
// the order is paid.
func Example() {
	c, err := client.New("localhost:7070", client.WithAPIKey(os.Getenv("DELAYD_API_KEY")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	// Order created: close it in 15 minutes unless it is paid.
	_, err = c.Upsert(ctx, "orders", client.TaskSpec{
		ID:      "order-42",
		Kind:    "order.close",
		Payload: []byte(`{"order_id":42}`),
		When:    client.After(15 * time.Minute),
	})
	if err != nil {
		log.Fatal(err)
	}

	// Order paid: the close is no longer needed.
	if _, err := c.Remove(ctx, "orders", "order-42"); err != nil {
		log.Fatal(err)
	}
}

// A consumer closes orders whose close task fell due. The conditional
// UPDATE makes the handler idempotent: a duplicate delivery, or a payment
// that won the race, changes nothing.
func ExampleClient_Consume() {
	c, err := client.New("localhost:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Stop on Ctrl-C: running handlers finish and their acks are sent first.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	err = c.Consume(ctx, "orders", func(ctx context.Context, d *client.Delivery) error {
		// UPDATE orders SET status='CLOSED' WHERE id=? AND status='WAIT_PAY'
		fmt.Printf("closing %s (attempt %d)\n", d.ID, d.Attempt)
		return nil // ack: the task is done
	}, client.ConsumeOptions{Concurrency: 16})
	if err != nil {
		log.Fatal(err)
	}
}

// A handler that knows when to try again says so with RetryAfter; any
// other error retries after the namespace's backoff.
func ExampleRetryAfter() {
	errThrottled := errors.New("payment gateway throttled us")
	handler := func(ctx context.Context, d *client.Delivery) error {
		if err := callGateway(ctx, d.Payload); errors.Is(err, errThrottled) {
			return client.RetryAfter(30*time.Second, err)
		} else if err != nil {
			return err
		}
		return nil
	}
	_ = handler
}

func callGateway(context.Context, []byte) error { return nil }

// Renewing a deadline is an upsert with the new time: each heartbeat pushes
// the device's "offline" task another 90 seconds out, so it fires only when
// heartbeats stop.
func ExampleClient_Upsert_renew() {
	c, err := client.New("localhost:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	onHeartbeat := func(ctx context.Context, deviceID string) error {
		_, err := c.Upsert(ctx, "devices", client.TaskSpec{
			ID:   deviceID,
			Kind: "device.offline",
			When: client.After(90 * time.Second),
		})
		return err
	}
	if err := onHeartbeat(context.Background(), "dev-7"); err != nil {
		log.Fatal(err)
	}
}

// Looking a task up, and telling "does not exist" from a failure.
func ExampleClient_Get() {
	c, err := client.New("localhost:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	task, err := c.Get(context.Background(), "loans", "loan-1001")
	switch status.Code(err) {
	case codes.OK:
		fmt.Println(task.State, task.DueTime, task.Attempt)
	case codes.NotFound:
		fmt.Println("no such task: acked, removed or never created")
	default:
		log.Fatal(err)
	}
}

// Listing the dead letters of a namespace, page by page behind an iterator.
func ExampleClient_List() {
	c, err := client.New("localhost:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for task, err := range c.List(context.Background(), "orders", client.ListOptions{State: client.StateDead}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(task.ID, task.Attempt, task.LastError)
	}
}

// Many tasks in one call, with a result per item.
func ExampleClient_BatchUpsert() {
	c, err := client.New("localhost:7070")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	due := time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)
	specs := []client.TaskSpec{
		{ID: "loan-1001", Kind: "loan.overdue", When: client.At(due)},
		{ID: "loan-1002", Kind: "loan.overdue", When: client.At(due)},
	}
	results, err := c.BatchUpsert(context.Background(), "loans", specs)
	if err != nil {
		log.Fatal(err) // the whole call failed (after retries)
	}
	for i, r := range results {
		if r.Err != nil {
			fmt.Println(specs[i].ID, "rejected:", r.Err)
		}
	}
}
