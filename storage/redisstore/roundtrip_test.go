package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// commandCounter is a go-redis hook that counts the commands sent.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestOneRoundTripPerBatch: upserting, popping, acking, nacking and
// extending 1,000 tasks costs one command each (the scripts are loaded).
func TestOneRoundTripPerBatch(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	counter := &commandCounter{}
	c.AddHook(counter)
	s := New(c, Options{})
	ctx := context.Background()
	ns := testkit.Namespace(t, "rt")
	dropNS(t, s, ns)

	specs := make([]storage.UpsertSpec, 1000)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%04d", i), Payload: []byte("payload")}
	}
	calls := func(name string, f func() error) {
		t.Helper()
		// the first run may load the script (EVALSHA, then EVAL)
		before := counter.n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := counter.n.Load() - before; n != 1 {
			t.Errorf("%s of 1,000 tasks sent %d commands, want 1", name, n)
		}
	}
	// load every script once
	for range 2 {
		if _, err := s.Upsert(ctx, ns, specs[:1]); err != nil {
			t.Fatal(err)
		}
	}
	warm := func(f func() error) { _ = f() }
	var ds []storage.Delivery
	calls("upsert", func() error { _, err := s.Upsert(ctx, ns, specs); return err })
	warm(func() error {
		_, err := s.Pop(ctx, ns+"x", storage.PopParams{Limit: 1, LeaseFor: time.Minute})
		return err
	})
	calls("pop", func() error {
		var err error
		ds, err = s.Pop(ctx, ns, storage.PopParams{Limit: 1000, LeaseFor: time.Minute})
		if len(ds) != 1000 {
			return fmt.Errorf("popped %d", len(ds))
		}
		return err
	})
	toks := make([]storage.Token, len(ds))
	for i, d := range ds {
		toks[i] = d.Token
	}
	warm(func() error { _, err := s.Extend(ctx, ns+"x", toks[:1], time.Minute); return err })
	calls("extend", func() error { _, err := s.Extend(ctx, ns, toks, time.Minute); return err })
	warm(func() error { _, _, err := s.Nack(ctx, ns+"x", toks[:1], storage.NackOptions{}); return err })
	calls("nack", func() error {
		_, _, err := s.Nack(ctx, ns, toks[:500], storage.NackOptions{RetryAfter: new(time.Duration)})
		return err
	})
	warm(func() error { _, err := s.Ack(ctx, ns+"x", toks[:1]); return err })
	calls("ack", func() error {
		st, err := s.Ack(ctx, ns, toks)
		if err == nil && (st[0] != storage.TokenNotFound || st[999] != storage.TokenOK) {
			return fmt.Errorf("statuses %v %v", st[0], st[999])
		}
		return err
	})
}

// TestMemoryPerTask: a pending task with a 100-byte payload costs at most
// 300 bytes of Redis memory (due ZSET entry + meta HASH entry), as Redis'
// MEMORY USAGE counts it. Most of it is Redis' own structure (dict entries,
// bucket arrays, skiplist nodes, sds headers). A payload this small is
// inline in the header (record.go), so there is no body HASH entry (it cost
// about 70 bytes more when every payload was kept apart: 344-355); the
// header with the payload (123 bytes for a fresh task) stays in the
// 128-byte allocation class. The bucket arrays cost 8-16 bytes per entry
// per dict with the table's fill, so the figure is taken at 30,000 tasks (a
// 32,768-bucket table, 92% full).
func TestMemoryPerTask(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	s := New(c, Options{})
	ctx := context.Background()
	ns := testkit.Namespace(t, "mem")
	dropNS(t, s, ns)
	const n = 30000
	payload := []byte(strings.Repeat("p", 100))
	for lo := 0; lo < n; lo += MaxBatch {
		specs := make([]storage.UpsertSpec, MaxBatch)
		for i := range specs {
			specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("order-%06d", lo+i), Payload: payload, Delay: time.Duration(lo+i) * time.Second}
		}
		if _, err := s.Upsert(ctx, ns, specs); err != nil {
			t.Fatal(err)
		}
	}
	k := keysFor(ns, 0)
	var total int64
	if n, err := c.Exists(ctx, k.body).Result(); err != nil || n != 0 {
		t.Errorf("body HASH exists (%d, %v); 100-byte payloads belong inline", n, err)
	}
	for _, key := range []string{k.due, k.meta} {
		b, err := c.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes", key, b)
		total += b
	}
	per := float64(total) / n
	t.Logf("%.0f bytes per pending task (12-byte ids, 100-byte payloads)", per)
	if per > 300 {
		t.Errorf("%.0f bytes per pending task, want at most 300", per)
	}
}
