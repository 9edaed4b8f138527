package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
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
// serves, and runs it until the test ends.
func start(t *testing.T, offlineAfter time.Duration, setup func(*App)) *started {
	t.Helper()
	// The program's own flags, with durations shortened to seconds.
	cfg, err := parseConfig([]string{
		"-delayd", exampletest.Delayd(t),
		"-mysql-dsn", testkit.Database(t, "ex_devices"),
		"-namespace", testkit.Namespace(t, "devices"),
		"-offline-after", offlineAfter.String(),
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

// heartbeat sends one heartbeat over HTTP, as a device would.
func (s *started) heartbeat(t *testing.T, id string) Device {
	t.Helper()
	resp, err := http.Post(s.base+"/devices/"+id+"/heartbeat", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dev Device
	if err := json.NewDecoder(resp.Body).Decode(&dev); err != nil || resp.StatusCode != http.StatusOK || dev.Status != StatusOnline {
		t.Fatalf("heartbeat = %d %+v (%v), want 200 ONLINE", resp.StatusCode, dev, err)
	}
	return dev
}

func (s *started) device(t *testing.T, id string) *Device {
	t.Helper()
	dev, err := s.app.devices.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

func (s *started) tickets(t *testing.T, id string) []Ticket {
	t.Helper()
	tks, err := s.app.devices.Tickets(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tks
}

func (s *started) task(t *testing.T, id string) (*client.Task, bool) {
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

func TestHeartbeatsRenewTheExpiry(t *testing.T) {
	t.Parallel()
	// Heartbeats every 200 ms must each be answered well within the
	// expiry: 1.5 s leaves room on a loaded machine (800 ms did not).
	const offlineAfter = 1500 * time.Millisecond
	s := start(t, offlineAfter, nil)
	// Heartbeats every 200 ms for three expiry periods.
	var last Device
	n := 0
	for end := time.Now().Add(3 * offlineAfter); time.Now().Before(end); n++ {
		last = s.heartbeat(t, "dev-1")
		time.Sleep(200 * time.Millisecond)
	}
	if dev := s.device(t, "dev-1"); dev.Status != StatusOnline {
		t.Errorf("status = %s while heartbeats kept coming, want ONLINE", dev.Status)
	}
	if tks := s.tickets(t, "dev-1"); len(tks) != 0 {
		t.Errorf("%d maintenance tickets for a device that never went silent", len(tks))
	}
	task, ok := s.task(t, "dev-1")
	if !ok || task.Generation != int64(n) || task.State != client.StateScheduled {
		t.Errorf("offline task = %+v, want generation %d (one upsert per heartbeat) still scheduled", task, n)
	}
	if last.HeartbeatSeq != uint64(n) {
		t.Errorf("heartbeat_seq = %d after %d heartbeats", last.HeartbeatSeq, n)
	}
}

func TestSilentDeviceGoesOfflineWithATicket(t *testing.T) {
	t.Parallel()
	// The late heartbeat below must be answered before its own expiry
	// (offlineAfter later) fires: 2 s leaves room on a loaded machine,
	// where 500 ms did not (the answer read the device already offline).
	s := start(t, 2*time.Second, nil)
	s.heartbeat(t, "dev-2")
	s.heartbeat(t, "dev-2")
	testkit.Eventually(t, 20*time.Second, "the silent device to go offline", func() bool { return s.device(t, "dev-2").Status == StatusOffline })
	tks := s.tickets(t, "dev-2")
	if len(tks) != 1 || tks[0].Reason != "offline" || tks[0].HeartbeatSeq != 2 || tks[0].RecoveredAt != nil {
		t.Fatalf("tickets = %+v, want one open 'offline' ticket after heartbeat 2", tks)
	}
	testkit.Eventually(t, 10*time.Second, "the task to be acked", func() bool { _, ok := s.task(t, "dev-2"); return !ok })

	// A late heartbeat brings it back and closes the ticket.
	dev := s.heartbeat(t, "dev-2")
	if dev.Status != StatusOnline || dev.HeartbeatSeq != 3 {
		t.Errorf("after the late heartbeat: %+v, want ONLINE seq 3", dev)
	}
	tks = s.tickets(t, "dev-2")
	if len(tks) != 1 || tks[0].RecoveredAt == nil {
		t.Errorf("tickets = %+v, want the ticket recovered", tks)
	}
	if _, ok := s.task(t, "dev-2"); !ok {
		t.Error("no offline task after the late heartbeat; a second silence would go unnoticed")
	}
	// And a second silence is noticed again.
	testkit.Eventually(t, 20*time.Second, "the second silence", func() bool { return s.device(t, "dev-2").Status == StatusOffline })
	if tks := s.tickets(t, "dev-2"); len(tks) != 2 {
		t.Errorf("%d tickets after two silences, want 2", len(tks))
	}
}

// A heartbeat that arrives while the offline delivery is being handled:
// the device must end ONLINE, with no open ticket.
func TestHeartbeatRacingTheExpiry(t *testing.T) {
	t.Parallel()
	inFlight := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	s := start(t, 400*time.Millisecond, func(a *App) {
		// One handler at a time, so the probe's handling proves the raced
		// delivery's handler returned.
		a.cfg.Concurrency = 1
		a.devices.beforeOffline = func(_ context.Context, p offlinePayload, _ *client.Delivery) error {
			if p.DeviceID == "dev-3" && p.Seq == 1 {
				once.Do(func() { close(inFlight) })
				<-release
			}
			return nil
		}
	})
	s.heartbeat(t, "dev-3")
	select {
	case <-inFlight:
	case <-time.After(20 * time.Second):
		t.Fatal("the expiry was not delivered")
	}
	s.heartbeat(t, "dev-3") // late, while the expiry is in the handler
	probe := client.TaskSpec{ID: "probe", Payload: []byte(`{"device_id": "nobody", "seq": 1}`), When: client.After(0)}
	if _, err := s.app.delayd.Upsert(t.Context(), s.app.cfg.Namespace, probe); err != nil {
		t.Fatal(err)
	}
	close(release)
	testkit.Eventually(t, 20*time.Second, "the probe behind the raced delivery to be handled", func() bool {
		_, err := s.app.delayd.Get(t.Context(), s.app.cfg.Namespace, "probe")
		return status.Code(err) == codes.NotFound
	})
	// The late heartbeat (seq 2) schedules its own expiry 400 ms on; on a
	// loaded machine that one may legitimately fire before these checks run.
	// What must never happen is the raced expiry (seq 1) taking effect.
	laterExpiry := false
	for _, tk := range s.tickets(t, "dev-3") {
		switch {
		case tk.RecoveredAt != nil:
		case tk.HeartbeatSeq < 2:
			t.Errorf("open ticket %+v from the expiry the late heartbeat raced", tk)
		default:
			laterExpiry = true
		}
	}
	if dev := s.device(t, "dev-3"); dev.Status != StatusOnline && !laterExpiry {
		t.Errorf("status = %s: a heartbeat during the expiry's delivery left the device offline", dev.Status)
	}
}

func TestBadDeviceID(t *testing.T) {
	t.Parallel()
	s := start(t, time.Minute, nil)
	resp, err := http.Post(s.base+"/devices/bad%20id/heartbeat", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("heartbeat of a bad id = %d, want 400", resp.StatusCode)
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
	exampletest.QuietOnBadPayload(t, func(l *slog.Logger) client.Handler { return (&Devices{logger: l}).HandleOffline })
}
