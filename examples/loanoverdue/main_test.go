package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/examples/internal/exampletest"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

type started struct {
	app  *App
	base string
}

// start opens the program like main does, lets setup adjust it before it
// serves, and runs it until the test ends. Reconciliation is off unless
// cfg asks; tests call Reconcile directly.
func start(t *testing.T, period, renewBy time.Duration, setup func(*App)) *started {
	t.Helper()
	// The program's own flags, with durations shortened to seconds.
	cfg, err := parseConfig([]string{
		"-delayd", exampletest.Delayd(t),
		"-mysql-dsn", testkit.Database(t, "ex_loans"),
		"-namespace", testkit.Namespace(t, "loans"),
		"-loan-period", period.String(),
		"-renew-by", renewBy.String(),
		"-reconcile-every", "0",
		"-http", "127.0.0.1:0",
		"-concurrency", "4",
	})
	if err != nil {
		t.Fatal(err)
	}
	app, err := open(t.Context(), cfg, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(app)
	}
	return &started{app: app, base: exampletest.Serve(t, app.serve, app.Close)}
}

func (s *started) post(t *testing.T, path, body string) (int, Loan) {
	t.Helper()
	resp, err := http.Post(s.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ln Loan
	_ = json.NewDecoder(resp.Body).Decode(&ln)
	return resp.StatusCode, ln
}

func (s *started) loan(t *testing.T, id uint64) *Loan {
	t.Helper()
	ln, err := s.app.loans.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func (s *started) notices(t *testing.T, id uint64) int {
	t.Helper()
	var n int
	if err := s.app.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM overdue_notice WHERE loan_id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *started) task(t *testing.T, id uint64) (*client.Task, bool) {
	t.Helper()
	task, err := s.app.delayd.Get(t.Context(), s.app.cfg.Namespace, taskID(id))
	if status.Code(err) == codes.NotFound {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return task, true
}

// waitTaskDue waits until the relay has sent the loan's overdue task at
// due (it is parked far ahead between the relay's two calls).
func (s *started) waitTaskDue(t *testing.T, id uint64, due time.Time) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, "the overdue task due at "+due.String(), func() bool {
		task, ok := s.task(t, id)
		return ok && task.DueTime.Equal(due)
	})
}

// borrowed applies for and confirms a loan over HTTP.
func (s *started) borrowed(t *testing.T) uint64 {
	t.Helper()
	code, ln := s.post(t, "/loans", `{"user_id": 7, "book_id": 42}`)
	if code != http.StatusCreated || ln.Status != StatusApplied {
		t.Fatalf("POST /loans = %d %+v, want 201 APPLIED", code, ln)
	}
	code, ln = s.post(t, fmt.Sprintf("/loans/%d/confirm", ln.ID), "")
	if code != http.StatusOK || ln.Status != StatusBorrowed || ln.DueAt == nil {
		t.Fatalf("confirm = %d %+v, want 200 BORROWED with a due date", code, ln)
	}
	return ln.ID
}

func TestLoanBecomesOverdueAtItsDueDate(t *testing.T) {
	t.Parallel()
	s := start(t, time.Second, time.Hour, nil)
	id := s.borrowed(t)
	s.waitTaskDue(t, id, *s.loan(t, id).DueAt)
	testkit.Eventually(t, 20*time.Second, "the loan to become overdue", func() bool { return s.loan(t, id).Status == StatusOverdue })
	ln := s.loan(t, id)
	if ln.OverdueAt.Before(*ln.DueAt) {
		t.Errorf("marked overdue at %v, before its due date %v", ln.OverdueAt, ln.DueAt)
	}
	if n := s.notices(t, id); n != 1 {
		t.Errorf("%d overdue notices, want 1", n)
	}
	testkit.Eventually(t, 10*time.Second, "the task to be acked", func() bool { _, ok := s.task(t, id); return !ok })
	// An overdue book can still be returned.
	if code, ln := s.post(t, fmt.Sprintf("/loans/%d/return", id), ""); code != http.StatusOK || ln.Status != StatusReturned {
		t.Errorf("return of an overdue loan = %d %+v, want 200 RETURNED", code, ln)
	}
}

func TestReturnRemovesTheTask(t *testing.T) {
	t.Parallel()
	// Borrow and return must both land before the due date: 3 s leaves
	// room on a loaded machine (1 s did not: the notice went out first).
	const period = 3 * time.Second
	s := start(t, period, time.Hour, nil)
	id := s.borrowed(t)
	if code, ln := s.post(t, fmt.Sprintf("/loans/%d/return", id), ""); code != http.StatusOK || ln.Status != StatusReturned {
		t.Fatalf("return = %d %+v, want 200 RETURNED", code, ln)
	}
	testkit.Eventually(t, 20*time.Second, "the relay to remove the overdue task", func() bool { _, ok := s.task(t, id); return !ok })
	time.Sleep(2 * period) // past the old due date
	if st := s.loan(t, id).Status; st != StatusReturned {
		t.Errorf("status = %s after the due date, want RETURNED", st)
	}
	if n := s.notices(t, id); n != 0 {
		t.Errorf("%d overdue notices for a returned book", n)
	}
}

func TestRenewMovesTheDueDate(t *testing.T) {
	t.Parallel()
	// The renewal must land before the old due date: 3 s leaves room for
	// borrow and renew on a loaded machine (1 s did not).
	const period, renewBy = 3 * time.Second, 2 * time.Second
	var mu sync.Mutex
	var delivered []int64 // due dates (ms) of the deliveries
	s := start(t, period, renewBy, func(a *App) {
		a.loans.beforeOverdue = func(_ context.Context, p overduePayload, _ *client.Delivery) error {
			mu.Lock()
			delivered = append(delivered, p.DueAtMs)
			mu.Unlock()
			return nil
		}
	})
	id := s.borrowed(t)
	oldDue := *s.loan(t, id).DueAt
	code, ln := s.post(t, fmt.Sprintf("/loans/%d/renew", id), "")
	if code != http.StatusOK || ln.Renewals != 1 || !ln.DueAt.Equal(oldDue.Add(renewBy)) {
		t.Fatalf("renew = %d %+v, want renewals 1 and due %v", code, ln, oldDue.Add(renewBy))
	}
	s.waitTaskDue(t, id, *ln.DueAt)
	testkit.Eventually(t, 20*time.Second, "the loan to become overdue at the new date", func() bool { return s.loan(t, id).Status == StatusOverdue })
	if got := s.loan(t, id).OverdueAt; got.Before(*ln.DueAt) {
		t.Errorf("overdue at %v, before the renewed due date %v", got, ln.DueAt)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ms := range delivered {
		if ms == oldDue.UnixMilli() {
			t.Errorf("the old due date %v fired after the renewal", oldDue)
		}
	}
	if len(delivered) == 0 {
		t.Error("no delivery observed")
	}
}

// A renewal that lands while the old date's delivery is already being
// handled: the handler's due_at condition keeps the loan BORROWED.
func TestRenewWhileOldDeliveryInFlight(t *testing.T) {
	t.Parallel()
	inFlight := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	s := start(t, 500*time.Millisecond, time.Hour, func(a *App) {
		// One handler at a time, so a later task's handling proves the
		// earlier one returned.
		a.cfg.Concurrency = 1
		a.loans.beforeOverdue = func(_ context.Context, _ overduePayload, d *client.Delivery) error {
			if d.ID != "probe" {
				once.Do(func() { close(inFlight); <-release }) // the first delivery only
			}
			return nil
		}
	})
	id := s.borrowed(t)
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("the first delivery did not arrive")
	}
	ln, err := s.app.loans.Renew(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	s.waitTaskDue(t, id, *ln.DueAt) // the relay sent the renewal
	// A probe task queued behind the stale delivery on the single worker.
	probe := client.TaskSpec{ID: "probe", Payload: []byte(`{"loan_id": 999999999, "due_at_ms": 1}`), When: client.After(0)}
	if _, err := s.app.delayd.Upsert(t.Context(), s.app.cfg.Namespace, probe); err != nil {
		t.Fatal(err)
	}
	close(release)
	testkit.Eventually(t, 20*time.Second, "the probe behind the stale delivery to be handled", func() bool {
		_, err := s.app.delayd.Get(t.Context(), s.app.cfg.Namespace, "probe")
		return status.Code(err) == codes.NotFound
	})
	if ln := s.loan(t, id); ln.Status != StatusBorrowed {
		t.Errorf("status = %s after a renewal raced the old date's delivery, want BORROWED", ln.Status)
	}
	if n := s.notices(t, id); n != 0 {
		t.Errorf("%d overdue notices for a renewed loan", n)
	}
	if task, ok := s.task(t, id); !ok || !task.DueTime.Equal(*ln.DueAt) || task.State != client.StateScheduled {
		t.Errorf("task = %+v; want the renewed one still scheduled", task)
	}
}

func TestReconcileRepairsLostTasks(t *testing.T) {
	t.Parallel()
	s := start(t, time.Hour, time.Hour, nil)
	db := s.app.db
	past := dueTime(time.Now().Add(-time.Hour))
	// Rows written as if the overdue upsert had been lost: delayd knows
	// nothing of them.
	insert := func(status string, due time.Time) uint64 {
		res, err := db.ExecContext(t.Context(),
			`INSERT INTO borrow_order (user_id, book_id, status, borrow_at, due_at) VALUES (1, 1, ?, NOW(3), ?)`, status, due)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		return uint64(id)
	}
	lost := insert(StatusBorrowed, past)
	notYet := insert(StatusBorrowed, dueTime(time.Now().Add(time.Hour)))
	returned := insert(StatusReturned, past)

	n, err := s.app.loans.Reconcile(t.Context(), time.Minute, 500)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("reconcile re-upserted %d tasks, want 1 (only the borrowed, past-due loan)", n)
	}
	testkit.Eventually(t, 20*time.Second, "the repaired loan to become overdue", func() bool { return s.loan(t, lost).Status == StatusOverdue })
	if n := s.notices(t, lost); n != 1 {
		t.Errorf("%d notices for the repaired loan, want 1", n)
	}
	for _, id := range []uint64{notYet, returned} {
		if _, ok := s.task(t, id); ok {
			t.Errorf("reconcile scheduled loan %d, which is not past due and borrowed", id)
		}
	}
	// A second round finds nothing: the loan is OVERDUE now.
	if n, err := s.app.loans.Reconcile(t.Context(), time.Minute, 500); err != nil || n != 0 {
		t.Errorf("second reconcile = %d, %v; want 0", n, err)
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
		ls := &Loans{logger: l}
		return func(ctx context.Context, d *client.Delivery) error { return ls.HandleOverdue(ctx, nil, d) }
	})
}
