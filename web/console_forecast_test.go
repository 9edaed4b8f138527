package web_test

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd/daemon"
)

// TestConsoleForecastAndHistory: the namespace page draws the due forecast
// from the server's real counts (a bar per minute of the next hour and
// per hour of the next day, beside the recent delivery figures), and the
// task view shows a task's history, also after the task was removed.
func TestConsoleForecastAndHistory(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	d := startConsole(t, daemon.Config{HTTPListen: "127.0.0.1:0", AdminKey: adminKey})
	e := &env{t: t, base: "http://" + d.HTTPAddr(), d: d}
	ns := e.namespace("ui-f-", map[string]any{"historyRetentionBytes": "65536"})
	upsert := func(id, delay string) {
		e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": ns, "id": id, "delay": delay})
	}
	upsert("soon-1", "150s")    // minute 2
	upsert("soon-2", "150s")    // minute 2
	upsert("later", "1800s")    // minute 29
	upsert("tonight", "10900s") // hour 3
	upsert("loan-1", "3600s")
	upsert("loan-1", "7200s") // rescheduled: hour 1
	e.mustCall(adminKey, "TaskService/RemoveTask", map[string]any{"namespace": ns, "id": "loan-1"})

	bars := func(chart string) string {
		return fmt.Sprintf(`Array.from(document.querySelectorAll('#%s rect.bar')).map(r => +r.getAttribute('data-n'))`, chart)
	}
	ctx := b.tab()
	b.run(t, ctx, "the namespace page draws the forecast with the real counts", signIn(e.base, adminKey),
		chromedp.Navigate(e.base+"/ui/#/ns/"+ns),
		chromedp.WaitVisible(chromedp.ID("forecast-minutes")),
		waitJS(bars("forecast-minutes")+`.length === 60 && `+bars("forecast-minutes")+`[2] === 2 && `+bars("forecast-minutes")+`[29] === 1 && `+
			bars("forecast-minutes")+`.reduce((a, b) => a + b) === 3`),
		waitJS(bars("forecast-hours")+`.length === 24 && `+bars("forecast-hours")+`[0] === 3 && `+bars("forecast-hours")+`[3] === 1`),
		// The bars are drawn: the tallest has height, empty buckets none.
		waitJS(`+document.querySelectorAll('#forecast-minutes rect.bar')[2].getAttribute('height') > 10 && `+
			`+document.querySelectorAll('#forecast-minutes rect.bar')[0].getAttribute('height') === 0`),
		chromedp.WaitVisible(chromedp.ID("recent-rate")),
		b.shot("forecast"))

	b.run(t, ctx, "the removed task's history: upserted, rescheduled, removed, by the admin key",
		chromedp.SendKeys(chromedp.ID("task-id"), "loan-1"),
		chromedp.Click(chromedp.ID("find-btn")),
		chromedp.WaitVisible(chromedp.ID("task-gone")),
		waitJS(`Array.from(document.querySelectorAll('#history tbody tr')).map(r => r.dataset.kind).join() === "upserted,rescheduled,removed"`),
		waitJS(`document.querySelector('#history tbody tr td code').textContent === "admin-key"`),
		b.shot("history"))
	b.noError(t, ctx, "forecast and history")
}
