package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/client/outbox"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// The fault tests of issue 29: each runs on MariaDB and PostgreSQL against
// a real delayd, counts the business effects (rows of the effects table,
// written by the Once handler in its transaction) and reports accepted /
// lost / duplicate; each must be 0 lost, 0 duplicate.

// TestDelaydStoppedDuringCommits: delayd stops after 300 of 1,000
// business commits and comes back after the last; the commits never wait
// for it, and every task arrives once after it returns.
func TestDelaydStoppedDuringCommits(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, d)
			ob := e.startRelay()
			e.consume(ob, nil)
			want := ids("o", 1000)
			addr := e.delayd.addr()
			for i, id := range want {
				if i == 300 {
					e.delayd.stop()
				}
				e.order(ob, id, time.Now(), true)
			}
			pending, err := ob.Pending(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if pending == 0 {
				t.Fatal("no row pending while delayd was stopped: the test did not stop it in time")
			}
			t.Logf("%d of 1000 commits done while delayd was stopped; %d rows waiting", 700, pending)
			e.delayd = startDelayd(t, addr)
			report(t, want, e.settle(ob, want, 3*time.Minute))
		})
	}
}

// TestTwoRelaysEachEffectOnce: two relays on one table, four writers at
// once; each task's effect happens once.
func TestTwoRelaysEachEffectOnce(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, d)
			a, b := e.startRelay(), e.startRelay()
			e.consume(a, nil)
			want := ids("o", 400)
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					for i := w; i < len(want); i += 4 {
						if err := e.tryOrder(a, want[i], time.Now(), true); err != nil {
							errs <- err
							return
						}
						b.Wake()
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			report(t, want, e.settle(a, want, 2*time.Minute))
		})
	}
}

// TestRelayKilledBetweenSendAndDelete: a relay in a child process is
// SIGKILLed right after delayd answered its park call (before the parked
// versions are recorded) or its arm call (before the rows are deleted).
// After the arm crash every task has already run and been acked when the
// next relay sends the rows again, which is where a plain resend would
// create the tasks a second time.
func TestRelayKilledBetweenSendAndDelete(t *testing.T) {
	for _, d := range dialects {
		for _, point := range []string{"park-sent", "arm-sent"} {
			t.Run(d.String()+"/"+point, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, d)
				ob := e.outbox(e.c)
				e.consume(ob, nil)
				want := ids("o", 50)
				for _, id := range want {
					e.order(ob, id, time.Now(), true)
				}
				e.child("relay", point)
				if n, err := ob.Pending(t.Context()); err != nil || n != int64(len(want)) {
					t.Fatalf("after the relay was killed at %s: %d rows pending (%v); want all %d (sent, not deleted)", point, n, err, len(want))
				}
				if point == "arm-sent" {
					waitEffects(t, e, want, time.Minute)
					t.Logf("all %d tasks ran and were acked before the rows were sent again", len(want))
				}
				e.startRelay()
				report(t, want, e.settle(ob, want, 2*time.Minute))
			})
		}
	}
}

// TestConsumerKilledAfterCommitBeforeAck: a consumer in a child process is
// SIGKILLed right after its handler's transaction committed, before the
// ack; the redelivery is acked without running the handler again.
func TestConsumerKilledAfterCommitBeforeAck(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, d)
			setAckTimeout(t, e, 2*time.Second)
			ob := e.startRelay()
			want := ids("o", 20)
			for _, id := range want {
				e.order(ob, id, time.Now(), true)
			}
			waitPending(t, ob, time.Minute)
			e.child("consumer", "once-committed")
			if eff := e.effects(); len(eff) != 1 {
				t.Fatalf("the killed consumer left %d effects; want 1 (it dies after its first commit)", len(eff))
			}
			var ran counter
			e.consume(ob, ran.add)
			report(t, want, e.settle(ob, want, 2*time.Minute))
			if got := ran.total(); got != len(want)-1 {
				t.Errorf("the handler ran %d times after the crash; want %d (the committed delivery's redelivery acked without a run)", got, len(want)-1)
			}
		})
	}
}

func waitEffects(t *testing.T, e *env, want []string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		eff := e.effects()
		done := 0
		for _, id := range want {
			if eff[id] > 0 {
				done++
			}
		}
		if done == len(want) && e.liveTasks() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d effects after %v", done, len(want), limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func setAckTimeout(t *testing.T, e *env, d time.Duration) {
	t.Helper()
	admin := delaydv1.NewNamespaceServiceClient(e.c.Conn())
	if _, err := admin.CreateNamespace(t.Context(), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: e.ns, Policy: &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(d)}},
	}); err != nil {
		t.Fatal(err)
	}
}

// child runs this test binary again as a relay or consumer of e
// (TestChildProcess) that SIGKILLs itself at hook point, and waits for it
// to die so. It fails t if the child ends any other way.
func (e *env) child(role, point string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChildProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "OUTBOX_CHILD="+role, "OUTBOX_CRASH_AT="+point,
		"OUTBOX_DIALECT="+strconv.Itoa(int(e.dialect)), "OUTBOX_DSN="+e.dsn, "OUTBOX_NS="+e.ns, "OUTBOX_DELAYD="+e.delayd.addr())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		e.t.Fatalf("child %s: %v; want it SIGKILLed at %s\n%s", role, err, point, out.String())
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		e.t.Fatalf("child %s ended with %v; want it SIGKILLed at %s\n%s", role, err, point, out.String())
	}
}

// TestChildProcess is not a test of its own: the fault tests run the test
// binary again with OUTBOX_CHILD set, and this is that child, a relay
// ("relay") or an Once consumer ("consumer", one delivery at a time) that
// SIGKILLs itself at the hook point OUTBOX_CRASH_AT.
func TestChildProcess(t *testing.T) {
	role := os.Getenv("OUTBOX_CHILD")
	if role == "" {
		return // run as a plain test: nothing to do
	}
	dialect, _ := strconv.Atoi(os.Getenv("OUTBOX_DIALECT"))
	e := &env{t: t, dialect: outbox.Dialect(dialect), dsn: os.Getenv("OUTBOX_DSN"), ns: os.Getenv("OUTBOX_NS")}
	e.db = e.open()
	c, err := client.New(os.Getenv("OUTBOX_DELAYD"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e.c = c
	ob := e.outbox(c)
	point := os.Getenv("OUTBOX_CRASH_AT")
	outbox.SetHook(ob, func(p string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	switch role {
	case "relay":
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		<-ctx.Done()
	case "consumer":
		err = c.Consume(ctx, e.ns, ob.Once(func(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
			return e.effect(ctx, tx, d)
		}), client.ConsumeOptions{Concurrency: 1, MaxInFlight: 1})
		t.Log(err)
	default:
		t.Fatalf("OUTBOX_CHILD=%q: relay or consumer", role)
	}
	t.Fatalf("not killed at %s within a minute", point)
}
