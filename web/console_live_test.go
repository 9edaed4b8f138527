package web_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// TestConsoleLiveStatsInFlightAndLateness: the namespaces page keeps its
// stats live (a task upserted after the page opened shows up without a
// reload, and a due task nobody takes shows its growing lateness), and a
// delivered, unacked task is listed in the namespace's in-flight tab.
func TestConsoleLiveStatsInFlightAndLateness(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	d := startConsole(t, daemon.Config{HTTPListen: "127.0.0.1:0", AdminKey: adminKey})
	e := &env{t: t, base: "http://" + d.HTTPAddr(), d: d}
	ns := e.namespace("ui-c-", map[string]any{"ackTimeout": "600s"})
	ctx := b.tab()
	row := fmt.Sprintf(`#namespaces tr[data-ns=%q]`, ns)
	cell := func(col string) string {
		return fmt.Sprintf(`document.querySelector('%s td[data-col=%s]')?.textContent`, row, col)
	}
	b.run(t, ctx, "sign in; the new namespace is empty", signIn(e.base, adminKey),
		chromedp.WaitVisible(chromedp.CSS(row)),
		waitJS(cell("scheduled")+` === "0" && `+cell("lateness")+` === "0 s"`))

	// Due now, and no subscriber: it waits, later and later.
	e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": "late-1", "kind": "order.close", "delay": "0s"})
	var lateness string
	b.run(t, ctx, "the page, not reloaded, shows the task and its lateness",
		waitJS(cell("scheduled")+` === "1" && `+cell("dueNow")+` === "1" && parseFloat(`+cell("lateness")+`) >= 1 &&
			document.querySelector('`+row+`').classList.contains('late')`),
		into(&lateness, chromedp.Text(chromedp.CSS(row+` td[data-col=lateness]`))),
		b.shot("namespaces-late"))
	if s, ok := strings.CutSuffix(lateness, " s"); !ok {
		t.Errorf("lateness %q, want seconds", lateness)
	} else if v, err := strconv.ParseFloat(s, 64); err != nil || v < 1 || v > 120 {
		t.Errorf("lateness %q, want between 1 s and 2 min", lateness)
	}

	// A subscriber takes it and does not ack: in flight.
	conn, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+adminKey), time.Minute)
	defer cancel()
	stream, err := delaydv1.NewDeliveryServiceClient(conn).Subscribe(sctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetDelivery().GetTask().GetId() != "late-1" {
		t.Fatalf("subscribe: %v, %v", r, err)
	}
	b.run(t, ctx, "the namespace row shows it in flight, no longer late",
		waitJS(cell("delivered")+` === "1" && `+cell("dueNow")+` === "0" && `+cell("lateness")+` === "0 s"`),
		chromedp.Click(chromedp.CSS(row+" a")),
		chromedp.WaitVisible(chromedp.ID("tab-inflight")),
		chromedp.Click(chromedp.ID("tab-inflight")),
		chromedp.WaitVisible(chromedp.CSS(`#tasks tr[data-id="late-1"]`)),
		waitJS(`document.getElementById('stat-delivered')?.textContent === "1"`),
		b.shot("in-flight"))
	b.noError(t, ctx, "live stats and in-flight tasks")
}
