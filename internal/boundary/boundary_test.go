package boundary

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/delayd/delayd"

// rule says which delayd packages one package may import. Packages outside
// the module (the standard library, go-redis, grpc, ...) are not checked.
type rule struct {
	// imports are the delayd packages its non-test files may import.
	imports []string
	// testImports are what its _test.go files may import on top of imports
	// (and the package itself, for external tests).
	testImports []string
	// testOnly: only _test.go files and other test-only packages may depend
	// on it (conformance suites, the test kit, fakes).
	testOnly bool
}

// rules are the allowed arrows, by package path inside the module. A key
// ending in "/..." covers every package below it that has no rule of its
// own. docs/ARCHITECTURE.md draws the same picture; change both together.
var rules = map[string]rule{
	// The contract and the domain: they import no delayd package.
	"gen/delayd/v1": {},
	"storage":       {},

	// Stores implement storage's interfaces and never import each other.
	// Their tests run the conformance suites against a real server.
	"storage/redisstore": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storetest", "storage/registrytest", "internal/testkit"},
	},
	// mysqlstore implements the authority seam.
	"storage/mysqlstore": {
		imports:     []string{"storage", "storage/authority"},
		testImports: []string{"storage/storetest", "storage/registrytest", "internal/testkit"},
	},
	// The seam between durable mode and its authority: the Authority
	// interface and the write types it speaks, owned by neither side.
	"storage/authority": {imports: []string{"storage"}},
	// The durable composition sees its authority only through the seam
	// (the daemon opens MySQL and hands it over; a test may hand a fake)
	// and the Redis index only through its own Index interface; its tests
	// compose the real ones.
	"storage/durable": {
		imports: []string{"storage", "storage/authority"},
		testImports: []string{"storage/redisstore", "storage/mysqlstore", "storage/storetest",
			"storage/registrytest", "internal/testkit"},
	},
	// Conformance suites: every store passes them; tests only.
	"storage/storetest":    {imports: []string{"storage", "internal/testkit"}, testOnly: true},
	"storage/registrytest": {imports: []string{"storage"}, testOnly: true},
	// In-memory and faulty stores for the layers above the stores; tests only.
	"storage/storagefake": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storetest", "storage/registrytest"},
		testOnly:    true,
	},
	// The shared test kit: connect helpers, redis-server starters, proxies.
	"internal/testkit": {imports: []string{"storage"}, testOnly: true},
	// Starts delayd for tests (in-process); apart from testkit because the
	// daemon's own tests use testkit.
	"internal/testkit/delaydtest": {imports: []string{"daemon", "internal/testkit"}, testOnly: true},

	// The layers above the stores see only storage's types and interfaces.
	"tenancy": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storagefake", "internal/testkit"},
	},
	"dispatcher": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storagefake", "internal/testkit"},
	},
	// HTTP push: the signed request, the operator's allow list and the
	// client that enforces it; the dispatcher calls it through its own
	// Pusher interface.
	"push": {
		imports:     []string{"storage"},
		testImports: []string{"internal/testkit"},
	},
	// Schedules (recurring tasks): the rules as pure functions, the loop
	// that fires the slots and the operations the ScheduleService runs; it
	// sees only storage's interfaces (the stores apply a step atomically).
	"schedule": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storagefake", "internal/testkit"},
	},
	// Task history: the store decorator that records task events into a
	// storage.History; it sees only storage's interfaces.
	"history": {
		imports:     []string{"storage"},
		testImports: []string{"storage/storagefake"},
	},
	// Metrics: collectors and the ops listener; fed by whoever holds the
	// numbers, never reaching into the stores.
	"metrics": {
		imports:     []string{"storage", "buildinfo"},
		testImports: []string{"internal/testkit"},
	},
	// The ops HTTP listener (/metrics, /healthz, /readyz, pprof): handed
	// its handlers and readiness check; imports no delayd package.
	"ops": {},
	// Version, commit and Go version of this binary.
	"buildinfo": {},
	// Durations with days (400d) for delayd's and delayctl's flags.
	"internal/duration": {},
	// "Did you mean …?": the closest of known names to a misspelt one.
	"internal/suggest": {},
	// The list items of a request, counted at every depth before it is
	// decoded (wire bytes and JSON text): one rule for both edges.
	"internal/items": {testImports: []string{"gen/delayd/v1"}},
	// The OpenTelemetry tracer provider from the OTEL_* environment.
	"tracing": {},
	// The gRPC edge: the services, over three packages of its own.
	"server": {
		imports: []string{"gen/delayd/v1", "storage", "dispatcher", "tenancy", "metrics", "schedule",
			"server/guard", "server/rpcerr", "server/wire", "internal/items"},
		testImports: []string{"storage/storagefake", "internal/testkit"},
	},
	// The edge's one guard (TLS, admission, authentication and
	// authorization, rate and subscriber limits, quota, the stream guard):
	// it knows requests by their wire types and answers through the one
	// error mapping, never the services.
	"server/guard": {
		imports:     []string{"gen/delayd/v1", "storage", "tenancy", "server/rpcerr"},
		testImports: []string{"storage/storagefake"},
	},
	// The one mapping from an error to the status a client sees.
	"server/rpcerr": {imports: []string{"storage", "server/wire"}},
	// Domain ↔ wire conversions both the services and the mapping use.
	"server/wire": {imports: []string{"gen/delayd/v1", "storage"}},
	// The HTTP edge: vanguard in front of the gRPC server's handler, and
	// the console; it knows no service code. Its tests run over the wire
	// against a real delayd.
	"web": {
		imports: []string{"internal/suggest", "internal/items"},
		// server only for server.Limits in daemon.Config.
		testImports: []string{"daemon", "server", "gen/delayd/v1", "internal/testkit", "internal/testkit/delaydtest"},
	},
	// Wiring of one process; its tests are the end-to-end tests, over the
	// wire, against real stores.
	"daemon": {
		imports: []string{"server", "server/guard", "web", "dispatcher", "push", "tenancy", "metrics", "history", "schedule", "ops", "buildinfo", "tracing", "storage",
			"storage/redisstore", "storage/mysqlstore", "storage/durable", "internal/duration", "internal/suggest"},
		testImports: []string{"gen/delayd/v1", "client", "internal/testkit"},
	},

	// deploy/ holds no Go code, only tests of the deployment files and the
	// image, which read delayd --help and talk to a delayd as a client.
	"deploy": {testImports: []string{"daemon", "client", "internal/testkit"}},
	// clients/ holds the other languages' clients; its Go tests only build
	// delayd and run those clients' own tests against it.
	"clients": {testImports: []string{"daemon", "internal/testkit", "internal/testkit/delaydtest"}},

	// Binaries.
	"cmd/delayd":        {imports: []string{"daemon"}, testImports: []string{"gen/delayd/v1", "internal/testkit"}},
	"cmd/delayctl":      {imports: []string{"ctl"}},
	"cmd/delaybench":    {imports: []string{"bench"}},
	"bench":             {imports: []string{"daemon", "gen/delayd/v1", "bench/baseline", "client", "storage/redisstore", "schedule"}, testImports: []string{"internal/testkit"}},
	"bench/baseline":    {testImports: []string{"internal/testkit"}},
	"internal/boundary": {},

	// The Go SDK talks to delayd only over the wire; its tests start a real
	// delayd in-process.
	"client": {
		imports:     []string{"gen/delayd/v1"},
		testImports: []string{"daemon", "internal/testkit"},
	},
	// The transactional outbox and effect-once consumer: an SDK package
	// over the client and the wire API (its relay calls the batch RPCs
	// itself); its tests use real MySQL/PostgreSQL and a real delayd.
	"client/outbox": {
		imports:     []string{"client", "gen/delayd/v1"},
		testImports: []string{"daemon", "internal/testkit"},
	},
	// delayctl's commands: a client program over the typed admin client;
	// its golden tests start a real delayd in-process.
	"ctl": {
		imports:     []string{"client", "internal/duration", "buildinfo"},
		testImports: []string{"daemon", "internal/testkit", "internal/testkit/delaydtest"},
	},
	// Examples are client programs.
	"examples/internal/exampletest": {imports: []string{"client", "daemon", "internal/testkit", "internal/testkit/delaydtest"}, testOnly: true},
	"examples/...": {
		imports:     []string{"client", "client/outbox"},
		testImports: []string{"examples/internal/exampletest", "internal/testkit"},
	},
}

// exceptions are test imports that break the rules, each with the reason it
// is tolerated. It is empty, and stays so: a test that needs another arrow
// belongs elsewhere (end-to-end tests in daemon/, unit tests over
// storage/storagefake). The last two lines went when storage/durable's
// whole-daemon test moved to daemon/e2e_durable_test.go.
var exceptions = map[arrow]string{}

// arrow is one test import, importer → imported, both inside the module.
type arrow struct{ from, to string }

// pkg is what `go list -json` says about one package.
type pkg struct {
	ImportPath   string
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

func listModule(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,TestImports,XTestImports,Error", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	return pkgs
}

// rel returns path inside the module, or "" for a package outside it.
func rel(path string) string {
	if path == module {
		return "."
	}
	if r, ok := strings.CutPrefix(path, module+"/"); ok {
		return r
	}
	return ""
}

// ruleFor returns the rule of a package: its own, or the nearest "/..."
// rule above it.
func ruleFor(p string) (rule, bool) {
	if r, ok := rules[p]; ok {
		return r, true
	}
	for dir := p; dir != "."; {
		i := strings.LastIndex(dir, "/")
		if i < 0 {
			break
		}
		dir = dir[:i]
		if r, ok := rules[dir+"/..."]; ok {
			return r, true
		}
	}
	return rule{}, false
}

// check returns every broken rule in pkgs, one line each, sorted, and the
// exceptions that no longer match anything.
func check(pkgs []pkg) (violations []string, unused []arrow) {
	used := map[arrow]bool{}
	testOnly := func(p string) bool { r, _ := ruleFor(p); return r.testOnly }
	for _, p := range pkgs {
		name := rel(p.ImportPath)
		if name == "" {
			continue
		}
		r, ok := ruleFor(name)
		if !ok {
			violations = append(violations, name+": has no rule; add one to internal/boundary/boundary_test.go (and docs/ARCHITECTURE.md) saying what it may import")
			continue
		}
		for _, imp := range p.Imports {
			to := rel(imp)
			if to != "" && !slices.Contains(r.imports, to) {
				violations = append(violations, name+" imports "+to+": not an allowed arrow (allowed: "+list(r.imports)+")")
			}
		}
		if !r.testOnly {
			for _, dep := range p.Deps {
				if to := rel(dep); to != "" && testOnly(to) {
					violations = append(violations, name+" depends on "+to+": a test-only package; only _test.go files may import it")
				}
			}
		}
		for _, imp := range append(slices.Clone(p.TestImports), p.XTestImports...) {
			to := rel(imp)
			if to == "" || to == name || slices.Contains(r.imports, to) || slices.Contains(r.testImports, to) {
				continue
			}
			if _, ok := exceptions[arrow{name, to}]; ok {
				used[arrow{name, to}] = true
				continue
			}
			violations = append(violations, name+" (tests) imports "+to+": not an allowed arrow (allowed in tests: "+list(append(slices.Clone(r.imports), r.testImports...))+")")
		}
	}
	for a := range exceptions {
		if !used[a] {
			unused = append(unused, a)
		}
	}
	sort.Strings(violations)
	violations = slices.Compact(violations)
	sort.Slice(unused, func(i, j int) bool { return unused[i].from+unused[i].to < unused[j].from+unused[j].to })
	return violations, unused
}

func list(ps []string) string {
	if len(ps) == 0 {
		return "no delayd package"
	}
	return strings.Join(ps, ", ")
}

// TestBoundaries is the check: every package of the module keeps its rule.
func TestBoundaries(t *testing.T) {
	violations, unused := check(listModule(t))
	for _, v := range violations {
		t.Error(v)
	}
	// An exception nothing needs any more is dropped by whoever sees this;
	// it does not fail the run, so the commit that fixed the test lands
	// without touching this file.
	for _, a := range unused {
		t.Logf("exception no longer needed, delete it: %s (tests) -> %s", a.from, a.to)
	}
}

// TestCheckCatches feeds the check made-up packages that break each kind of
// rule, so a check that quietly passes everything fails here.
func TestCheckCatches(t *testing.T) {
	p := func(path string) string { return module + "/" + path }
	pkgs := []pkg{
		{ImportPath: p("dispatcher"), Imports: []string{p("storage"), p("storage/redisstore")}},
		{ImportPath: p("server"), Deps: []string{p("storage/storetest")}},
		{ImportPath: p("tenancy"), XTestImports: []string{p("daemon")}},
		{ImportPath: p("newpkg")},
		{ImportPath: p("storage/redisstore"), Imports: []string{"github.com/redis/go-redis/v9", p("storage")},
			TestImports: []string{p("storage/storetest")}},
		{ImportPath: p("examples/newexample"), Imports: []string{p("client")}},
	}
	violations, _ := check(pkgs)
	want := []string{
		"dispatcher imports storage/redisstore",
		"newpkg: has no rule",
		"server depends on storage/storetest",
		"tenancy (tests) imports daemon",
	}
	if len(violations) != len(want) {
		t.Fatalf("check found %d violations, want %d:\n%s", len(violations), len(want), strings.Join(violations, "\n"))
	}
	for i, w := range want {
		if !strings.HasPrefix(violations[i], w) {
			t.Errorf("violation %d = %q, want it to start with %q", i, violations[i], w)
		}
	}
}
