package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client/outbox"
	"github.com/delayd/delayd/internal/testkit"
)

func TestConfigAndInputErrorsNameTheField(t *testing.T) {
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		cfg  outbox.Config
		want string
	}{
		{outbox.Config{}, "Config.Dialect"},
		{outbox.Config{Dialect: outbox.MySQL, Table: "Outbox"}, "Config.Table"},
		{outbox.Config{Dialect: outbox.MySQL, Table: "a; DROP TABLE x"}, "Config.Table"},
		{outbox.Config{Dialect: outbox.Postgres, BatchSize: 1001}, "Config.BatchSize"},
		{outbox.Config{Dialect: outbox.Postgres, ParkFor: -time.Second}, "ParkFor"},
	} {
		if _, err := outbox.New(db, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v; want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	ob, err := outbox.New(db, outbox.Config{Dialect: outbox.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "Config.Client") {
		t.Errorf("Start without a client = %v; want an error naming Config.Client", err)
	}
	// Checked before the transaction is touched (tx nil would fail later).
	ctx := t.Context()
	due := time.Now()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{ob.Upsert(ctx, nil, "Orders", outbox.Task{ID: "a", DueAt: due}), "namespace"},
		{ob.Upsert(ctx, nil, "orders", outbox.Task{ID: "a/b", DueAt: due}), "id"},
		{ob.Upsert(ctx, nil, "orders", outbox.Task{ID: "a", Kind: "x\n", DueAt: due}), "kind"},
		{ob.Upsert(ctx, nil, "orders", outbox.Task{ID: "a"}), "DueAt"},
		{ob.Upsert(ctx, nil, "orders", outbox.Task{ID: "a", DueAt: due}), "tx is nil"},
		{ob.Remove(ctx, nil, "orders", ""), "id"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("got %v; want an error naming %s", tc.err, tc.want)
		}
	}
	if stmts, err := outbox.Schema(outbox.Postgres, "svc_outbox"); err != nil || len(stmts) != 4 || !strings.Contains(stmts[0], `"svc_outbox"`) {
		t.Errorf("Schema(Postgres) = %d statements, %v; want 4 naming \"svc_outbox\"", len(stmts), err)
	}
}

// TestRollbackSchedulesNothing: a business transaction that rolls back
// after its Upsert leaves no task, and one that rolls back its Remove
// leaves the task; the committed ones reach delayd and run once.
func TestRollbackSchedulesNothing(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, d)
			ob := e.startRelay()
			e.consume(ob, nil)
			committed := ids("kept", 20)
			for i, id := range committed {
				e.order(ob, id, time.Now(), true)
				e.order(ob, ids("rolled-back", 20)[i], time.Now(), false)
			}
			// A task far ahead whose cancel rolls back stays scheduled.
			e.order(ob, "later", time.Now().Add(2*time.Hour), true)
			tx, err := ob.DB().BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Remove(t.Context(), tx, e.ns, "later"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			eff := e.settle(ob, committed, 60*time.Second)
			report(t, committed, eff)
			for _, id := range ids("rolled-back", 20) {
				if _, err := e.c.Get(t.Context(), e.ns, id); status.Code(err) != codes.NotFound {
					t.Fatalf("task %s of a rolled-back transaction: Get = %v; want NotFound", id, err)
				}
			}
			if task, err := e.c.Get(t.Context(), e.ns, "later"); err != nil || string(task.Payload) != "later" {
				t.Fatalf("task whose Remove rolled back: %v, %v; want it scheduled", task, err)
			}
		})
	}
}

// TestRowsOfATaskGoInOrder: a task upserted several times and then
// removed, or upserted after a remove, ends as its last row says, with
// two relays sharing the table.
func TestRowsOfATaskGoInOrder(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, d)
			obs := []*outbox.Outbox{e.startRelay(), e.startRelay()}
			ctx := t.Context()
			later := time.Now().Add(2 * time.Hour)
			write := func(f func(tx *sql.Tx) error) {
				tx, err := obs[0].DB().BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := f(tx); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			for v := range 4 {
				for _, id := range ids("renewed", 30) {
					write(func(tx *sql.Tx) error {
						return obs[0].Upsert(ctx, tx, e.ns, outbox.Task{ID: id, Payload: []byte{byte('0' + v)}, DueAt: later.Add(time.Duration(v) * time.Minute)})
					})
				}
			}
			for _, id := range ids("cancelled", 10) {
				write(func(tx *sql.Tx) error { return obs[0].Upsert(ctx, tx, e.ns, outbox.Task{ID: id, DueAt: later}) })
				write(func(tx *sql.Tx) error { return obs[0].Remove(ctx, tx, e.ns, id) })
			}
			for _, id := range ids("recreated", 10) {
				write(func(tx *sql.Tx) error { return obs[0].Remove(ctx, tx, e.ns, id) })
				write(func(tx *sql.Tx) error {
					return obs[0].Upsert(ctx, tx, e.ns, outbox.Task{ID: id, Payload: []byte("again"), DueAt: later})
				})
			}
			for _, ob := range obs {
				ob.Wake()
			}
			waitPending(t, obs[0], 60*time.Second)
			for _, id := range ids("renewed", 30) {
				task, err := e.c.Get(ctx, e.ns, id)
				if err != nil || string(task.Payload) != "3" || !task.DueTime.Equal(later.Add(3*time.Minute).Truncate(time.Millisecond)) {
					t.Fatalf("%s after 4 upserts: %+v, %v; want the last one's payload 3 and due time", id, task, err)
				}
			}
			for _, id := range ids("cancelled", 10) {
				if _, err := e.c.Get(ctx, e.ns, id); status.Code(err) != codes.NotFound {
					t.Fatalf("%s upserted then removed: Get = %v; want NotFound", id, err)
				}
			}
			for _, id := range ids("recreated", 10) {
				if task, err := e.c.Get(ctx, e.ns, id); err != nil || string(task.Payload) != "again" {
					t.Fatalf("%s removed then upserted: %+v, %v; want it scheduled", id, task, err)
				}
			}
		})
	}
}

// waitPending waits until the outbox has no row left to send.
func waitPending(t *testing.T, ob *outbox.Outbox, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		n, err := ob.Pending(context.WithoutCancel(t.Context()))
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending after %v", n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsCountWhatTheRelayDid: every row delayd accepted is one
// commit-to-accepted observation and one accepted row, and a removed row
// counts as removed, so an operator's dashboard agrees with the table.
func TestMetricsCountWhatTheRelayDid(t *testing.T) {
	e := newEnv(t, outbox.MySQL)
	m := outbox.NewMetrics()
	ob, err := outbox.New(e.open(), outbox.Config{Dialect: outbox.MySQL, Client: e.c, PollInterval: 20 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids("metered", 5) {
		e.order(ob, id, time.Now().Add(time.Hour), true)
	}
	tx, err := ob.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Remove(t.Context(), tx, e.ns, "metered-0"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := ob.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Stop(context.Background()) })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP delayd_outbox_rows_total Outbox rows the relay finished, by result (accepted, removed, superseded, failed).
# TYPE delayd_outbox_rows_total counter
delayd_outbox_rows_total{result="accepted"} 5
delayd_outbox_rows_total{result="removed"} 1
`
	// The relay counts a round's rows after its transaction commits:
	// wait for the counts, not for the table to empty.
	testkit.Eventually(t, time.Minute, "the relay's metrics to count 5 accepted and 1 removed", func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(want), "delayd_outbox_rows_total") == nil
	})
	if n, err := ob.Pending(t.Context()); err != nil || n != 0 {
		t.Fatalf("after the relay counted every row: %d rows pending (%v); want 0", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "delayd_outbox_commit_to_accepted_seconds" {
			if got := mf.GetMetric()[0].GetHistogram().GetSampleCount(); got != 6 {
				t.Fatalf("commit-to-accepted observations = %d; want 6 (one per row delayd took: 5 upserts, 1 remove)", got)
			}
			return
		}
	}
	t.Fatal("delayd_outbox_commit_to_accepted_seconds was not collected")
}
