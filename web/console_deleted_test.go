package web_test

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd/daemon"
)

// TestConsoleNamespaceDeletedWhileListed: a namespace deleted (by another
// operator, another test) while the namespace list polls its stats is
// marked deleted on its row and no longer asked for; the page shows no
// error and the other rows keep updating. The stats call's NOT_FOUND used
// to put "not_found namespace ... not found" in the error banner (seen in
// TestConsole once the web tests' cleanup deleted their namespaces while
// other tests' pages listed them).
func TestConsoleNamespaceDeletedWhileListed(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	d := startConsole(t, daemon.Config{HTTPListen: "127.0.0.1:0", AdminKey: adminKey})
	e := &env{t: t, base: "http://" + d.HTTPAddr(), d: d}
	keep := e.namespace("0del-keep-", nil) // 0…: first in name order, within the console's live-stats limit (200) however many namespaces the shared test database holds
	gone := e.namespace("0del-gone-", nil)
	row := func(ns string) string { return fmt.Sprintf(`tr[data-ns=%q]`, ns) }
	cell := func(ns, col string) string {
		return fmt.Sprintf(`document.querySelector('%s td[data-col=%s]').textContent`, row(ns), col)
	}

	ctx := b.tab()
	b.run(t, ctx, "sign in: both namespaces with live stats", signIn(e.base, adminKey),
		chromedp.WaitVisible(chromedp.CSS(row(gone))),
		waitJS(cell(gone, "scheduled")+` === "0" && `+cell(keep, "scheduled")+` === "0"`))
	e.mustCall(adminKey, "NamespaceService/DeleteNamespace", map[string]any{"namespace": gone})
	e.mustCall(adminKey, "TaskService/UpsertTask", map[string]any{"namespace": keep, "id": "t1", "delay": "3600s"})
	b.run(t, ctx, "the deleted one is marked at the next refresh, the other goes on",
		waitJS(fmt.Sprintf(`document.querySelector('%s').classList.contains('deleted') && %s === "deleted"`, row(gone), cell(gone, "scheduled"))),
		waitJS(cell(keep, "scheduled")+` === "1"`),
		b.shot("namespace-deleted"))
	b.noError(t, ctx, "a namespace deleted while the list shows it")
}
