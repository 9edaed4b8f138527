package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storetest"
)

// loadCounter counts LibraryLoaded calls by reason.
type loadCounter struct {
	start, missing atomic.Int64
}

func (c *loadCounter) LibraryLoaded(reason string) {
	switch reason {
	case LoadAtStart:
		c.start.Add(1)
	case LoadMissing:
		c.missing.Add(1)
	default:
		panic("unknown reason " + reason)
	}
}

// libraries are the delayd_* libraries a server holds, by name, with their
// functions.
func libraries(t *testing.T, c redis.Cmdable) map[string][]string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: "delayd_*"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, l := range libs {
		for _, f := range l.Functions {
			out[l.Name] = append(out[l.Name], f.Name)
		}
	}
	return out
}

// TestLibraryBuild: the library registers one function per entry, named
// by the version, read-only ones flagged no-writes; ScriptNames lists the
// same names and the EVALSHA digests; and the version follows from the
// sources alone.
func TestLibraryBuild(t *testing.T) {
	t.Parallel()
	if !strings.HasPrefix(lib.text, "#!lua name="+lib.name+"\n") || len(lib.version) != 12 {
		t.Fatalf("library %q opens %q", lib.name, lib.text[:40])
	}
	again := mustBuildLibrary(luaFS, readOnlyEntries)
	if again.name != lib.name || again.text != lib.text {
		t.Fatal("building the same sources twice gave two libraries")
	}
	names := ScriptNames()
	if len(names) != 2*len(lib.entries) || len(lib.entries) < 30 {
		t.Fatalf("%d script names for %d entries", len(names), len(lib.entries))
	}
	for _, e := range lib.entries {
		want := "redis.register_function{function_name='" + e.fn + "', callback=function(KEYS, ARGV)\n"
		if e.fn != LibraryName()+"_"+e.name || !strings.Contains(lib.text, want) {
			t.Errorf("entry %s: function %q not registered as %q", e.name, e.fn, want)
		}
		if names[e.fn] != e.name || names[e.script.Hash()] != e.name || e.readOnly != slices.Contains(readOnlyEntries, e.name) {
			t.Errorf("entry %s: ScriptNames gives %q for %s and %q for %s; read-only %v", e.name,
				names[e.fn], e.fn, names[e.script.Hash()], e.script.Hash(), e.readOnly)
		}
	}
	for _, ro := range readOnlyEntries {
		i := strings.Index(lib.text, "function_name='"+lib.name+"_"+ro+"'")
		next := strings.Index(lib.text[i+1:], "redis.register_function")
		if next < 0 {
			next = len(lib.text) - i - 1
		}
		if !strings.Contains(lib.text[i:i+1+next], "flags={'no-writes'}") {
			t.Errorf("read-only entry %s is not flagged no-writes", ro)
		}
	}
}

// TestConformanceEvalsha runs the store suite on Redis 7 through the
// EVALSHA builds, the path of servers without Functions: the same sources
// must answer the same through both.
func TestConformanceEvalsha(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	evalsha := func() *Store {
		s := New(c, Options{})
		s.loader.useEvalsha(nil)
		return s
	}
	storetest.Run(t, func(t *testing.T) storage.Store { return evalsha() })
	storetest.RunWakeups(t, func(t *testing.T) storetest.WakeupStore { return evalsha() })
}

// TestEmbeddedRunsEvalsha: miniredis has no FUNCTION or FCALL; the first
// call finds that out and the store runs the EVALSHA builds from then on,
// without an error reaching the caller.
func TestEmbeddedRunsEvalsha(t *testing.T) {
	t.Parallel()
	s := New(testMiniClient(t), Options{})
	ctx := t.Context()
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.loader.evalsha.Load() {
		t.Fatal("miniredis: LoadLibrary did not switch to EVALSHA")
	}
	s = New(s.rdb, Options{})
	if _, err := s.Upsert(ctx, "mini", []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if !s.loader.evalsha.Load() {
		t.Fatal("miniredis: the first call did not switch to EVALSHA")
	}
}

// TestNoFunctionPermission: a Redis ACL user that may not run FUNCTION
// LOAD or FCALL still gets a working store, through EVALSHA (its "nopass"
// takes any password; go-redis sends AUTH only with one).
func TestNoFunctionPermission(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	ctx := t.Context()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "noscripts", "on", "nopass", "~*", "&*", "+@all",
		"-function", "-fcall", "-fcall_ro").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noscripts", Password: "any"})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{})
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.loader.evalsha.Load() {
		t.Fatal("LoadLibrary without the permission did not switch to EVALSHA")
	}
	if _, err := New(c, Options{}).Upsert(ctx, "acl", []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
}

// TestLibraryReloadedWhenLost: the library is loaded at start, and a call
// that finds it gone (FUNCTION FLUSH, a restart without persistence) loads
// it again on that server and answers as if nothing happened; concurrent
// calls that miss share one load; every load is counted.
func TestLibraryReloadedWhenLost(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := srv.Client()
	loads := &loadCounter{}
	s := New(c, Options{LibraryMetrics: loads})
	ctx := t.Context()
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	if got := libraries(t, c)[lib.name]; len(got) != len(lib.entries) {
		t.Fatalf("after LoadLibrary the server holds %d functions of %s, want %d", len(got), lib.name, len(lib.entries))
	}
	if err := s.LoadLibrary(ctx); err != nil { // already there: not loaded again
		t.Fatal(err)
	}
	if n := loads.start.Load(); n != 1 {
		t.Fatalf("%d loads at start, want 1", n)
	}
	upsert := func(id string) {
		t.Helper()
		if _, err := s.Upsert(ctx, "lost", []storage.UpsertSpec{{ID: id, Delay: time.Hour}}); err != nil {
			t.Fatalf("upsert %s: %v", id, err)
		}
	}
	upsert("before")

	// FUNCTION FLUSH, then calls of several entries at once.
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 20 {
		wg.Go(func() {
			_, err := s.Upsert(ctx, "lost", []storage.UpsertSpec{{ID: fmt.Sprintf("t%d", i), Delay: time.Hour}})
			errs <- err
		})
		wg.Go(func() {
			_, err := s.Get(ctx, "lost", "before") // FCALL_RO
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call after FUNCTION FLUSH: %v", err)
		}
	}
	if n := loads.missing.Load(); n != 1 {
		t.Fatalf("after FUNCTION FLUSH: %d loads, want 1 shared by the 40 calls that missed", n)
	}

	// A restart: no persistence, so the data and the library are gone.
	srv.Restart()
	upsert("after")
	if n := loads.missing.Load(); n != 2 {
		t.Fatalf("after a restart: %d loads in all, want 2", n)
	}
	if st, err := s.Stats(ctx, "lost"); err != nil || st.Scheduled != 1 {
		t.Fatalf("after a restart: Stats = %+v, %v; want the one task written since", st, err)
	}
}

// TestLibraryVersionsSideBySide: two delayd versions on one Redis (a
// rolling upgrade) each load and call their own library; neither replaces
// or removes the other's.
func TestLibraryVersionsSideBySide(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := srv.Client()
	ctx := t.Context()
	other, err := buildLibrary(luaFS, readOnlyEntries, "0ther0versi0")
	if err != nil {
		t.Fatal(err)
	}
	if other.name == lib.name || other.entries["nextwake"].fn == scripts.nextWake.fn {
		t.Fatal("a second version names its library and functions as the first does")
	}
	s := New(c, Options{})
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	if err := newLoader(c, s.log, nil, other).loadAll(ctx, LoadAtStart); err != nil {
		t.Fatal(err)
	}
	libs := libraries(t, c)
	if len(libs) != 2 || len(libs[lib.name]) != len(lib.entries) || len(libs[other.name]) != len(other.entries) {
		t.Fatalf("the server holds %v; want %s and %s with every function", libs, lib.name, other.name)
	}
	k := keysFor("side", 0)
	nextWake := func(fn string) error {
		return c.FCallRO(ctx, fn, []string{k.due, k.inflight}).Err()
	}
	if err := nextWake(other.entries["nextwake"].fn); err != nil {
		t.Fatalf("the other version's function: %v", err)
	}
	// This version's library gone (its delayd stopped, an operator
	// deleted it): the other's still runs, and this one's next call loads
	// this one's again without touching the other's.
	if err := c.FunctionDelete(ctx, lib.name).Err(); err != nil {
		t.Fatal(err)
	}
	if err := nextWake(other.entries["nextwake"].fn); err != nil {
		t.Fatalf("the other version's function after this one's was deleted: %v", err)
	}
	if _, err := s.Upsert(ctx, "side", []storage.UpsertSpec{{ID: "x"}}); err != nil {
		t.Fatal(err)
	}
	if libs := libraries(t, c); len(libs) != 2 {
		t.Fatalf("after this version's call the server holds %v; want both versions", libs)
	}
}

// TestLibraryOnCluster: on a Redis Cluster the library is loaded on every
// master at start; a failover keeps it (functions are replicated, so the
// promoted replica has them: no load); a master added to the cluster has
// none, and the first call of a slot moved to it loads it there.
func TestLibraryOnCluster(t *testing.T) {
	t.Parallel()
	cl := testkit.StartCluster(t, 3, 1)
	ctx := t.Context()
	cc := cl.Client()
	t.Cleanup(func() { cc.Close() })
	loads := &loadCounter{}
	s := New(cc, Options{LibraryMetrics: loads})
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	if n := loads.start.Load(); n != 3 {
		t.Fatalf("%d loads at start on 3 masters, want 3", n)
	}
	masters, err := cl.MasterNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		c := m.Client()
		got := libraries(t, c)[lib.name]
		c.Close()
		if len(got) != len(lib.entries) {
			t.Fatalf("master %s holds %d functions of %s, want %d", m.Addr, len(got), lib.name, len(lib.entries))
		}
	}
	if err := cl.WaitReplicasCaughtUp(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Namespaces on the first master's slots: which ones is found by the
	// keys they write.
	victim := masters[0]
	var onVictim []string
	for i := 0; len(onVictim) < 2 && i < 200; i++ {
		ns := fmt.Sprintf("lib%d", i)
		if addr := masterOf(t, cc, keysFor(ns, 0).due); addr == victim.Addr {
			onVictim = append(onVictim, ns)
		}
	}
	if len(onVictim) < 2 {
		t.Fatal("no namespaces on the first master")
	}
	upsert := func(ns, id string) error {
		_, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Delay: time.Hour}})
		return err
	}
	for _, ns := range onVictim {
		if err := upsert(ns, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.WaitReplicasCaughtUp(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	// Failover: the replica has the functions.
	victim.Kill()
	if err := cl.WaitHealthy(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "an upsert on the failed-over slot", func() bool {
		return upsert(onVictim[0], "b") == nil
	})
	if n := loads.missing.Load(); n != 0 {
		t.Fatalf("after a failover: %d loads; the promoted replica had the library", n)
	}

	// A new master, and a slot moved to it: no library there until a call
	// finds it missing.
	added, err := cl.AddMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ac := added.Client()
	t.Cleanup(func() { ac.Close() })
	if got := libraries(t, ac); len(got) != 0 {
		t.Fatalf("the new master already holds %v", got)
	}
	moved := onVictim[1]
	if err := cl.MoveSlot(ctx, slotOf(moved+"#0"), added); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stats(ctx, moved); err != nil || st.Scheduled != 1 { // FCALL_RO on the new master
		t.Fatalf("Stats of the moved namespace = %+v, %v; want its one task", st, err)
	}
	if err := upsert(moved, "c"); err != nil {
		t.Fatal(err)
	}
	if got := libraries(t, ac)[lib.name]; len(got) != len(lib.entries) {
		t.Fatalf("the new master holds %d functions of %s after a call, want %d", len(got), lib.name, len(lib.entries))
	}
	if n := loads.missing.Load(); n != 1 {
		t.Fatalf("%d loads for the new master, want 1", n)
	}
}

// masterOf is the address of the master that serves key.
func masterOf(t *testing.T, cc *redis.ClusterClient, key string) string {
	t.Helper()
	m, err := cc.MasterForKey(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return m.Options().Addr
}
