package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/examples/internal/exampletest"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// TestDefaultNamespaceIsOwn: the example uses a namespace of its own.
func TestDefaultNamespaceIsOwn(t *testing.T) {
	cfg, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	exampletest.OwnNamespace(t, cfg.Namespace)
}

// TestBadPayloadIsAckedQuietly: a firing the handler cannot read is acked
// and its payload stays out of the log.
func TestBadPayloadIsAckedQuietly(t *testing.T) {
	exampletest.QuietOnBadPayload(t, func(l *slog.Logger) client.Handler {
		return (&Statements{logger: l}).Handler()
	})
}

// TestPreviousMonth: a statement covers the calendar month before its
// slot in the shop's zone, across a year's end and a 30-minute zone.
func TestPreviousMonth(t *testing.T) {
	for _, tc := range []struct{ zone, slot, period, from string }{
		{"Europe/Berlin", "2026-11-30T23:30:00Z", "2026-11", "2026-11-01T00:00:00+01:00"}, // 00:30 on Dec 1 in Berlin
		{"America/New_York", "2027-01-01T05:30:00Z", "2026-12", "2026-12-01T00:00:00-05:00"},
		{"Australia/Lord_Howe", "2026-03-31T13:30:00Z", "2026-03", "2026-03-01T00:00:00+11:00"}, // 00:30 on Apr 1 there
	} {
		loc, err := time.LoadLocation(tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		slot, _ := time.Parse(time.RFC3339, tc.slot)
		period, from, _ := previousMonth(slot, loc)
		if period != tc.period || from.Format(time.RFC3339) != tc.from {
			t.Errorf("%s %s: %s from %s, want %s from %s", tc.zone, tc.slot, period, from.Format(time.RFC3339), tc.period, tc.from)
		}
	}
}

// TestStatementsEndToEnd: a shop opened in Chatham's zone gets its
// statement of the month before the slot (in that zone), summing only that
// month's sales; further firings of the same month write nothing more;
// closing the shop deletes its schedule. The schedule fires every second
// here (--every 1s) instead of monthly.
func TestStatementsEndToEnd(t *testing.T) {
	addr := exampletest.Delayd(t)
	ns := testkit.Namespace(t, "statements")
	cfg, err := parseConfig([]string{"-delayd", addr, "-mysql-dsn", testkit.Database(t, "ex_statements"),
		"-namespace", ns, "-every", "1s", "-http", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	app, err := open(t.Context(), cfg, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	base := exampletest.Serve(t, app.serve, app.Close)

	loc, _ := time.LoadLocation("Pacific/Chatham")
	now := time.Now().In(loc)
	thisMonth := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, loc)
	lastMonth := thisMonth.AddDate(0, -1, 0)
	for _, s := range []struct {
		at    time.Time
		cents int64
	}{{lastMonth.Add(time.Hour), 1000}, {thisMonth.Add(-time.Minute), 250}, {thisMonth.Add(time.Minute), 99999}, {lastMonth.Add(-time.Minute), 77777}} {
		if _, err := app.db.Exec("INSERT INTO sale (shop_id, amount_cents, sold_at) VALUES (7, ?, ?)", s.cents, s.at.UTC()); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(base+"/shops", "application/json", strings.NewReader(`{"id": 7, "name": "Corner Books", "time_zone": "Pacific/Chatham"}`))
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("open shop: %v %v", resp, err)
	}
	resp.Body.Close()
	statements := func() []Statement {
		t.Helper()
		resp, err := http.Get(base + "/shops/7/statements")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out []Statement
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return out
	}
	testkit.Eventually(t, time.Minute, "the statement", func() bool { return len(statements()) > 0 })
	// Three more slots pass, and every firing due by then is handled
	// (acked: gone from the namespace).
	sched := app.delayd.Schedules()
	since := time.Now()
	testkit.Eventually(t, time.Minute, "three more firings handled", func() bool {
		if time.Since(since) < 3*time.Second {
			return false
		}
		for task, err := range app.delayd.List(context.Background(), ns, client.ListOptions{}) {
			if err != nil || !task.DueTime.After(time.Now()) {
				return false // a firing due is still waiting or in flight
			}
		}
		return true
	})
	got := statements()
	if len(got) != 1 || got[0].Period != lastMonth.Format("2006-01") || got[0].TotalCents != 1250 || got[0].Sales != 2 {
		t.Fatalf("statements %+v; want one for %s of 1250 cents in 2 sales", got, lastMonth.Format("2006-01"))
	}
	req, _ := http.NewRequest(http.MethodDelete, base+"/shops/7", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("close shop: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := sched.Get(context.Background(), ns, "shop-7"); status.Code(err) != codes.NotFound {
		t.Fatalf("the closed shop's schedule: %v, want NotFound", err)
	}
}
