package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// The names ScriptNames gives are those of the scripts the store really
// sends: a private redis-server logs every command (SLOWLOG at threshold
// 0) while the store upserts, pops and acks, and every FCALL it saw (and,
// through the EVALSHA builds, every EVALSHA) must map to the entry that
// ran.
func TestScriptNamesNameTheSHAsTheStoreSends(t *testing.T) {
	t.Parallel()
	for _, evalsha := range []bool{false, true} {
		t.Run(fmt.Sprintf("evalsha=%v", evalsha), func(t *testing.T) {
			t.Parallel()
			scriptNamesSent(t, evalsha)
		})
	}
}

func scriptNamesSent(t *testing.T, evalsha bool) {
	srv := testkit.StartRedis(t)
	c := srv.Client()
	ctx := context.Background()
	s := New(c, Options{})
	if evalsha {
		s.loader.useEvalsha(nil)
	}
	ns := testkit.Namespace(t, "names")
	// Load the library (or the scripts: EVALSHA fails once, EVAL loads),
	// then log.
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "warm"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
	if err != nil || len(ds) == 0 {
		t.Fatalf("pop: %d, %v", len(ds), err)
	}
	toks := make([]storage.Token, 0, len(ds))
	for _, d := range ds {
		toks = append(toks, d.Token)
	}
	if _, err := s.Ack(ctx, ns, toks); err != nil {
		t.Fatal(err)
	}
	log, err := c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	names := ScriptNames()
	var ran []string
	want := "fcall"
	if evalsha {
		want = "evalsha"
	}
	for _, e := range log {
		if len(e.Args) < 2 || !strings.HasPrefix(strings.ToLower(e.Args[0]), want) {
			continue
		}
		name, ok := names[e.Args[1]]
		if !ok {
			t.Errorf("%s %s: not in ScriptNames", e.Args[0], e.Args[1])
		}
		ran = append(ran, name)
	}
	for _, want := range []string{"upsert", "pop", "settle"} {
		if !slices.Contains(ran, want) {
			t.Errorf("scripts named in the log %v: no %q", ran, want)
		}
	}
	// Every script file has a name, the registry's included.
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	for _, want := range []string{"upsert", "pop", "settle", "reap", "registry_ns_create", "dropnamespace"} {
		if !have[want] {
			t.Errorf("ScriptNames has no %q", want)
		}
	}
	if have["lib"] {
		t.Error("lib.lua is no script of its own")
	}
}
