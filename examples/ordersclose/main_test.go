package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/examples/internal/exampletest"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// started is the program running against a real delayd and its own
// database.
type started struct {
	app  *App
	base string // HTTP base URL
}

// start opens the program like main does, lets setup adjust it (test hooks)
// before it serves, and runs it until the test ends.
func start(t *testing.T, closeAfter time.Duration, setup func(*App)) *started {
	t.Helper()
	// The program's own flags, with durations shortened to seconds.
	cfg, err := parseConfig([]string{
		"-delayd", exampletest.Delayd(t),
		"-mysql-dsn", testkit.Database(t, "ex_orders"),
		"-namespace", testkit.Namespace(t, "orders"),
		"-close-after", closeAfter.String(),
		"-http", "127.0.0.1:0",
		"-concurrency", "8",
	})
	if err != nil {
		t.Fatal(err)
	}
	logger := testkit.Logger(t)
	app, err := open(t.Context(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(app)
	}
	return &started{app: app, base: exampletest.Serve(t, app.serve, app.Close)}
}

func (s *started) post(t *testing.T, path, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(s.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func (s *started) status(t *testing.T, id uint64) string {
	t.Helper()
	ord, err := s.app.orders.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ord.Status
}

func (s *started) events(t *testing.T, id uint64) string {
	t.Helper()
	rows, err := s.app.db.QueryContext(t.Context(), `SELECT event FROM order_events WHERE order_id = ? ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var evs []string
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	return strings.Join(evs, ",")
}

// taskGone reports whether delayd no longer has the order's close task.
func (s *started) taskGone(t *testing.T, id uint64) bool {
	_, err := s.app.delayd.Get(t.Context(), s.app.cfg.Namespace, taskID(id))
	return status.Code(err) == codes.NotFound
}

func TestUnpaidOrderIsClosed(t *testing.T) {
	t.Parallel()
	s := start(t, time.Second, nil)
	code, body := s.post(t, "/orders", `{"amount_cents": 1999}`)
	if code != http.StatusCreated || body["status"] != StatusWaitPay {
		t.Fatalf("POST /orders = %d %v, want 201 WAIT_PAY", code, body)
	}
	id := uint64(body["id"].(float64))
	testkit.Eventually(t, 20*time.Second, "the order to close", func() bool { return s.status(t, id) == StatusClosed })
	if got := s.events(t, id); got != "CREATED,CLOSED" {
		t.Errorf("events = %s, want CREATED,CLOSED", got)
	}
	testkit.Eventually(t, 10*time.Second, "the close task to be acked", func() bool { return s.taskGone(t, id) })
	if code, body := s.post(t, fmt.Sprintf("/orders/%d/pay", id), ""); code != http.StatusConflict {
		t.Errorf("paying a closed order = %d %v, want 409", code, body)
	}
}

// Orders are taken while delayd is down: the close task waits in the
// outbox, written in the order's transaction, for the relay to send it.
func TestOrderTakenWhileDelaydDown(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig([]string{"-delayd", "127.0.0.1:1", // nothing listens there
		"-mysql-dsn", testkit.Database(t, "ex_orders"), "-namespace", testkit.Namespace(t, "orders")})
	if err != nil {
		t.Fatal(err)
	}
	app, err := open(t.Context(), cfg, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	ord, err := app.orders.Create(t.Context(), 500)
	if err != nil || ord.Status != StatusWaitPay {
		t.Fatalf("Create with delayd down = %+v, %v; want a WAIT_PAY order", ord, err)
	}
	if n, err := app.outbox.Pending(t.Context()); err != nil || n != 1 {
		t.Fatalf("outbox rows pending = %d, %v; want the order's close task waiting", n, err)
	}
}

func TestPaymentCancelsClose(t *testing.T) {
	t.Parallel()
	const closeAfter = time.Second
	s := start(t, closeAfter, nil)
	_, body := s.post(t, "/orders", `{"amount_cents": 500}`)
	id := uint64(body["id"].(float64))
	if code, body := s.post(t, fmt.Sprintf("/orders/%d/pay", id), ""); code != http.StatusOK || body["status"] != StatusPaid {
		t.Fatalf("pay = %d %v, want 200 PAID", code, body)
	}
	testkit.Eventually(t, 20*time.Second, "the relay to remove the close task", func() bool { return s.taskGone(t, id) })
	// Paying again (a retried payment callback) is fine.
	if code, _ := s.post(t, fmt.Sprintf("/orders/%d/pay", id), ""); code != http.StatusOK {
		t.Errorf("second pay = %d, want 200", code)
	}
	time.Sleep(2 * closeAfter) // past the time the close would have fired
	if st := s.status(t, id); st != StatusPaid {
		t.Errorf("status = %s after the close time, want PAID", st)
	}
	if got := s.events(t, id); got != "CREATED,PAID" {
		t.Errorf("events = %s, want CREATED,PAID", got)
	}
}

func TestFailedCloseIsRetried(t *testing.T) {
	t.Parallel()
	var attempts sync.Map // order id → []int32 of attempts seen
	s := start(t, 500*time.Millisecond, func(a *App) {
		a.orders.beforeClose = func(_ context.Context, id uint64, attempt int32) error {
			prev, _ := attempts.Load(id)
			seen, _ := prev.([]int32)
			attempts.Store(id, append(seen, attempt))
			if attempt == 1 {
				return errors.New("database failover in progress")
			}
			return nil
		}
	})
	ord, err := s.app.orders.Create(t.Context(), 100)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the order to close on the retry", func() bool { return s.status(t, ord.ID) == StatusClosed })
	v, _ := attempts.Load(ord.ID)
	if fmt.Sprint(v) != "[1 2]" {
		t.Errorf("close attempts = %v, want [1 2]: the failed first attempt nacked and delayd retried", v)
	}
	if got := s.events(t, ord.ID); got != "CREATED,CLOSED" {
		t.Errorf("events = %s, want CREATED,CLOSED", got)
	}
}

func TestPaymentAndCloseRace(t *testing.T) {
	t.Parallel()
	const (
		orders     = 40
		closeAfter = time.Second
	)
	var closes atomic.Int32
	s := start(t, closeAfter, func(a *App) {
		a.orders.beforeClose = func(context.Context, uint64, int32) error {
			closes.Add(1)
			// Widen the window in which a payment can arrive mid-close.
			time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
			return nil
		}
	})
	type outcome struct {
		id  uint64
		err error
	}
	results := make(chan outcome, orders)
	var wg sync.WaitGroup
	for range orders {
		ord, err := s.app.orders.Create(t.Context(), 100)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			// Pay somewhere around the close time: some before, some after.
			time.Sleep(closeAfter - 200*time.Millisecond + time.Duration(rand.IntN(400))*time.Millisecond)
			results <- outcome{ord.ID, s.app.orders.Pay(t.Context(), ord.ID)}
		})
	}
	wg.Wait()
	close(results)

	var paid, closed int
	for r := range results {
		testkit.Eventually(t, 20*time.Second, "every order to settle", func() bool {
			return s.status(t, r.id) != StatusWaitPay && s.taskGone(t, r.id)
		})
		st, ev := s.status(t, r.id), s.events(t, r.id)
		switch {
		case r.err == nil && st == StatusPaid && ev == "CREATED,PAID":
			paid++
		case errors.Is(r.err, ErrOrderClosed) && st == StatusClosed && ev == "CREATED,CLOSED":
			closed++
		default:
			t.Errorf("order %d: pay returned %v, status %s, events %s: not one consistent outcome", r.id, r.err, st, ev)
		}
	}
	t.Logf("%d paid, %d closed, %d close attempts", paid, closed, closes.Load())
	if paid+closed != orders {
		t.Errorf("%d paid + %d closed, want %d orders", paid, closed, orders)
	}
}

// The example keeps out of the README tour's namespaces and never logs a
// payload (a malformed one is acked and only its size logged).
func TestOwnNamespaceAndNoPayloadInLogs(t *testing.T) {
	cfg, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	exampletest.OwnNamespace(t, cfg.Namespace)
	exampletest.QuietOnBadPayload(t, func(l *slog.Logger) client.Handler {
		o := &Orders{logger: l}
		return func(ctx context.Context, d *client.Delivery) error { return o.HandleClose(ctx, nil, d) }
	})
}
