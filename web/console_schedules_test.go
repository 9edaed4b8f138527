package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd/daemon"
)

// TestConsoleSchedules: the Schedules tab lists a namespace's schedules,
// previews the next firings in UTC and in the zone, creates one from its
// form, pauses and resumes it, and the namespace's stats say how many
// firings the schedules will still create.
func TestConsoleSchedules(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	d := startConsole(t, daemon.Config{HTTPListen: "127.0.0.1:0", AdminKey: adminKey})
	e := &env{t: t, base: "http://" + d.HTTPAddr(), d: d}
	ns := e.namespace("ui-s-", nil)
	e.mustCall(adminKey, "ScheduleService/CreateSchedule", map[string]any{"schedule": map[string]any{
		"namespace": ns, "id": "hourly", "every": "3600s", "task": map[string]any{"kind": "report.hourly"}}})
	row := func(id string) string { return `document.querySelector('#schedules tr[data-schedule="` + id + `"]')` }
	ctx := b.tab()
	b.run(t, ctx, "the tab lists the schedule and previews it", signIn(e.base, adminKey),
		chromedp.Navigate(e.base+"/ui/#/ns/"+ns+"/schedules"),
		waitJS(row("hourly")+` && `+row("hourly")+`.dataset.state === 'active'`),
		chromedp.Click(chromedp.CSS(`#schedules tr[data-schedule="hourly"] button[data-action="preview"]`)),
		waitJS(`document.querySelectorAll('#preview tbody tr').length === 10 && /UTC$/.test(document.querySelector('#preview td.local').textContent)`),
		waitJS(`document.getElementById('forecast-firings') && /of which schedules' firings not created yet: 2[34] in the next day/.test(document.getElementById('forecast-firings').textContent)`),
		b.shot("schedules"))
	b.run(t, ctx, "create one in Berlin from the form, preview it, pause and resume it",
		chromedp.SendKeys(chromedp.ID("new-schedule-id"), "berlin"),
		chromedp.SendKeys(chromedp.ID("new-schedule-cron"), "30 2 * * *"),
		chromedp.SendKeys(chromedp.ID("new-schedule-tz"), "Europe/Berlin"),
		chromedp.Click(chromedp.ID("try-schedule-btn")),
		waitJS(`/ (CET|CEST)$/.test(document.querySelector('#preview td.local').textContent)`),
		chromedp.Click(chromedp.ID("create-schedule-btn")),
		waitJS(row("berlin")+` && `+row("berlin")+`.dataset.state === 'active'`),
		chromedp.Click(chromedp.CSS(`#schedules tr[data-schedule="berlin"] button[data-action="pause"]`)),
		waitJS(row("berlin")+` && `+row("berlin")+`.dataset.state === 'paused'`),
		chromedp.Click(chromedp.CSS(`#schedules tr[data-schedule="berlin"] button[data-action="resume"]`)),
		waitJS(row("berlin")+` && `+row("berlin")+`.dataset.state === 'active'`),
		b.shot("schedules-berlin"))
	b.noError(t, ctx, "schedules")
}
