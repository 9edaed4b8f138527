// Package baseline is the design delayd replaces, kept runnable so that the
// benchmark can measure it side by side with delayd on the same Redis and
// the same workload: a Lua upsert (ZADD + HSET, seed 001) and one poller that
// wakes on a fixed interval and pops due ids with ZRANGEBYSCORE LIMIT + ZREM
// in Lua (seeds 000 and 004), looping until a pop comes back short, as seed
// 004 recommends for large backlogs.
//
// It keeps the source design's properties on purpose: the pop deletes (a
// crash between pop and handling loses the task), due-ness is decided by the
// poller's clock, and latency is bounded below by the poll interval. Only the
// benchmark uses it.
package baseline

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed upsert.lua
	upsertSrc    string
	upsertScript = redis.NewScript(upsertSrc)

	//go:embed pop.lua
	popSrc    string
	popScript = redis.NewScript(popSrc)
)

// ScriptNames returns the name of each of the design's scripts ("upsert",
// "pop") keyed by the lower-case hex SHA1 an EVALSHA of it sends, for tools
// that read Redis's SLOWLOG (cmd/delaybench splits script calls by name).
func ScriptNames() map[string]string {
	return map[string]string{upsertScript.Hash(): "upsert", popScript.Hash(): "pop"}
}

// MaxPopBatch is the largest limit Pop accepts: the script unpacks the ids
// into one Redis command, and Lua's stack holds about 8,000 values.
const MaxPopBatch = 7000

// ErrBadBatch is returned by Pop for a limit outside 1..MaxPopBatch.
var ErrBadBatch = errors.New("baseline: pop limit out of range")

// Queue is a set of source-design queues under one key prefix. It is safe
// for concurrent use.
type Queue struct {
	rdb    redis.UniversalClient
	prefix string
}

// New returns the queues under prefix on rdb. Use a fresh prefix per run and
// call Cleanup when done.
func New(rdb redis.UniversalClient, prefix string) *Queue {
	return &Queue{rdb: rdb, prefix: prefix}
}

// Item is one task to add or renew.
type Item struct {
	ID string
	// Due is the due time; stored with millisecond precision.
	Due time.Time
	// Record is the task record the source design keeps in the HASH (its
	// JSON); here the payload.
	Record []byte
}

// Task is one popped task.
type Task struct {
	Queue string
	ID    string
	// Due is the due time the ZSET held (millisecond precision).
	Due time.Time
	// Record is the task record read in the same script; nil if the HASH
	// had none.
	Record []byte
}

// Upsert adds or renews one task in one round trip (the source design's
// setOrRefreshTask).
func (q *Queue) Upsert(ctx context.Context, queue string, it Item) error {
	k := queueKeys(q.prefix, queue)
	if err := upsertScript.Run(ctx, q.rdb, []string{k.zset, k.hash}, it.ID, it.Due.UnixMilli(), it.Record).Err(); err != nil {
		return fmt.Errorf("baseline upsert: %w", err)
	}
	return nil
}

// UpsertPipelined adds or renews many tasks with one pipeline of upsert
// scripts: the source design has no batch call, so this is the closest
// equivalent of delayd's BatchUpsertTasks.
func (q *Queue) UpsertPipelined(ctx context.Context, queue string, items []Item) error {
	if len(items) == 0 {
		return nil
	}
	k := queueKeys(q.prefix, queue)
	// A pipeline cannot fall back from EVALSHA to EVAL per command, so make
	// sure the script is cached first.
	if err := upsertScript.Load(ctx, q.rdb).Err(); err != nil {
		return fmt.Errorf("baseline upsert: load script: %w", err)
	}
	pipe := q.rdb.Pipeline()
	for _, it := range items {
		upsertScript.EvalSha(ctx, pipe, []string{k.zset, k.hash}, it.ID, it.Due.UnixMilli(), it.Record)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("baseline upsert: %w", err)
	}
	return nil
}

// Pop removes at most limit tasks of queue whose due time is <= now and
// returns them in due order.
func (q *Queue) Pop(ctx context.Context, queue string, now time.Time, limit int) ([]Task, error) {
	if limit < 1 || limit > MaxPopBatch {
		return nil, fmt.Errorf("%w: %d (allowed 1-%d)", ErrBadBatch, limit, MaxPopBatch)
	}
	k := queueKeys(q.prefix, queue)
	res, err := popScript.Run(ctx, q.rdb, []string{k.zset, k.hash}, now.UnixMilli(), limit).Slice()
	if err != nil {
		return nil, fmt.Errorf("baseline pop: %w", err)
	}
	if len(res)%3 != 0 {
		return nil, fmt.Errorf("baseline pop: reply has %d elements, want a multiple of 3", len(res))
	}
	tasks := make([]Task, 0, len(res)/3)
	for i := 0; i < len(res); i += 3 {
		id, _ := res[i].(string)
		score, _ := res[i+1].(string)
		ms, err := strconv.ParseFloat(score, 64)
		if err != nil {
			return nil, fmt.Errorf("baseline pop: score of %q: %w", id, err)
		}
		t := Task{Queue: queue, ID: id, Due: time.UnixMilli(int64(ms))}
		if rec, ok := res[i+2].(string); ok {
			t.Record = []byte(rec)
		}
		tasks = append(tasks, t)
	}
	return tasks, nil
}

// Len returns how many tasks queue holds.
func (q *Queue) Len(ctx context.Context, queue string) (int64, error) {
	n, err := q.rdb.ZCard(ctx, queueKeys(q.prefix, queue).zset).Result()
	if err != nil {
		return 0, fmt.Errorf("baseline len: %w", err)
	}
	return n, nil
}

// Cleanup deletes every key under the queue's prefix (with UNLINK, so a big
// key is freed in the background and Redis does not stall) and returns how
// many it deleted.
func (q *Queue) Cleanup(ctx context.Context) (int, error) {
	return DeleteMatching(ctx, q.rdb, Pattern(q.prefix))
}

// DeleteMatching UNLINKs every key matching the SCAN pattern and returns
// how many it deleted. It never flushes the database.
func DeleteMatching(ctx context.Context, rdb redis.UniversalClient, pattern string) (int, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// Every master in turn; keys one at a time (one UNLINK of keys in
		// several slots is refused).
		var mu sync.Mutex
		total := 0
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			var cursor uint64
			for {
				ks, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
				if err != nil {
					return fmt.Errorf("cleanup %q: %w", pattern, err)
				}
				for _, k := range ks {
					d, err := c.Unlink(ctx, k).Result()
					if err != nil {
						return fmt.Errorf("cleanup %q: %w", pattern, err)
					}
					mu.Lock()
					total += int(d)
					mu.Unlock()
				}
				if next == 0 {
					return nil
				}
				cursor = next
			}
		})
		return total, err
	}
	n := 0
	var cursor uint64
	for {
		ks, next, err := rdb.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return n, fmt.Errorf("cleanup %q: %w", pattern, err)
		}
		if len(ks) > 0 {
			d, err := rdb.Unlink(ctx, ks...).Result()
			if err != nil {
				return n, fmt.Errorf("cleanup %q: %w", pattern, err)
			}
			n += int(d)
		}
		if next == 0 {
			return n, nil
		}
		cursor = next
	}
}

// PollerConfig configures a Poller.
type PollerConfig struct {
	// Queue holds the queues to poll. Required.
	Queue *Queue
	// Queues are the queue names polled, in order, on every tick. Required.
	Queues []string
	// Interval between ticks (the source designs use 1-60 s). If unset or
	// zero, 1 second is used.
	Interval time.Duration
	// Batch is the pop limit; a tick pops a queue again while a pop comes
	// back full. If unset or zero, 200 is used (seed 004's figure); at most
	// MaxPopBatch.
	Batch int
	// Now is the poller's clock, which decides due-ness in the source
	// design. If nil, time.Now.
	Now func() time.Time
	// Handle is called for every popped task, in the poller goroutine, as
	// the source design's handler runs. Required.
	Handle func(Task)
	// Logger for pop errors. If nil, logs are discarded.
	Logger *slog.Logger
}

// Poller is the source design's single poller. Start it once, Stop it once.
type Poller struct {
	cfg    PollerConfig
	errs   atomic.Int64
	pops   atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewPoller checks cfg, fills in defaults and returns a Poller that does
// nothing until Start.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.Queue == nil || len(cfg.Queues) == 0 || cfg.Handle == nil {
		return nil, errors.New("baseline poller: Queue, Queues and Handle are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 200
	}
	if cfg.Batch > MaxPopBatch {
		return nil, fmt.Errorf("%w: %d (allowed 1-%d)", ErrBadBatch, cfg.Batch, MaxPopBatch)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Poller{cfg: cfg}, nil
}

// Start starts the poller goroutine; the first tick is one Interval later,
// like a fixed-rate scheduler's. It returns at once.
func (p *Poller) Start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.tick(ctx)
			}
		}
	}()
}

// tick pops every queue until it has nothing due.
func (p *Poller) tick(ctx context.Context) {
	for _, q := range p.cfg.Queues {
		for ctx.Err() == nil {
			tasks, err := p.cfg.Queue.Pop(ctx, q, p.cfg.Now(), p.cfg.Batch)
			p.pops.Add(1)
			if err != nil {
				if ctx.Err() == nil {
					p.errs.Add(1)
					p.cfg.Logger.Warn("baseline pop failed", "queue", q, "err", err)
				}
				break
			}
			for _, t := range tasks {
				p.cfg.Handle(t)
			}
			if len(tasks) < p.cfg.Batch {
				break
			}
		}
	}
}

// Stop ends the poller and waits for its goroutine, or until ctx is done.
// A tick in progress finishes its current pop first.
func (p *Poller) Stop(ctx context.Context) error {
	if p.cancel == nil {
		return nil
	}
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("baseline poller stop: %w", ctx.Err())
	}
}

// Errors returns how many pops failed so far.
func (p *Poller) Errors() int64 { return p.errs.Load() }

// Pops returns how many pop scripts ran so far (an idle poller's cost).
func (p *Poller) Pops() int64 { return p.pops.Load() }
