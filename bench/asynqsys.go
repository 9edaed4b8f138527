package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/bench/baseline"
)

// asynqCheckInterval is how often the asynq server moves due scheduled
// tasks to pending (its DelayedTaskCheckInterval; asynq's default is 5 s).
// 1 s is what a team that cares about lateness would set.
const asynqCheckInterval = time.Second

// asynqVersion is the asynq release built in (go.mod pins it), for reports.
func asynqVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/hibiken/asynq" {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}

// asynqConcurrency is the most tasks one asynq server processes at once
// per Subscribe stream delayd would have (asynq's default is the CPU count).
const asynqConcurrency = 64

// asynqSystem runs hibiken/asynq, what teams pick instead of delayd for
// delayed jobs in Go: Enqueue with ProcessAt and a TaskID per task, and one
// asynq server in this process, on the run's Redis. A namespace is an asynq
// queue.
type asynqSystem struct {
	rdb    redis.UniversalClient
	client *asynq.Client
}

func newAsynqSystem(rdb redis.UniversalClient) *asynqSystem {
	return &asynqSystem{rdb: rdb, client: asynq.NewClientFromRedisClient(rdb)}
}

func (a *asynqSystem) name() string { return SystemAsynq }

func (a *asynqSystem) setup(context.Context, []string) error { return nil }

// upsert enqueues one task per item. asynq has no batch enqueue, so a batch
// is a loop of Enqueue calls; a TaskID that exists is an error (asynq does
// not replace), which a run's unique ids never hit.
func (a *asynqSystem) upsert(ctx context.Context, ns string, items []item, payload []byte, _ bool) error {
	for _, it := range items {
		t := asynq.NewTask("bench", payload)
		if _, err := a.client.EnqueueContext(ctx, t, asynq.Queue(ns), asynq.TaskID(it.id), asynq.ProcessAt(it.due)); err != nil {
			return fmt.Errorf("asynq Enqueue: %w", err)
		}
	}
	return nil
}

// consume runs one asynq server over every namespace with
// asynqConcurrency workers per subscriber. The handler returns nil, which
// asynq takes as done (it deletes the task): arrival is counted as the ack,
// as for the baseline.
func (a *asynqSystem) consume(_ context.Context, nss []string, subscribers, _ int, s sink) (func(), error) {
	queues := make(map[string]int, len(nss))
	for _, ns := range nss {
		queues[ns] = 1
	}
	srv := asynq.NewServerFromRedisClient(a.rdb, asynq.Config{
		Concurrency:              max(subscribers, 1) * asynqConcurrency,
		Queues:                   queues,
		DelayedTaskCheckInterval: asynqCheckInterval,
		ShutdownTimeout:          time.Second,
		LogLevel:                 asynq.FatalLevel,
	})
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		now := time.Now()
		ns, _ := asynq.GetQueueName(ctx)
		s.delivered(ns, t.ResultWriter().TaskID(), now)
		s.acked(1, 0, now)
		return nil
	}))
	if err != nil {
		return nil, fmt.Errorf("asynq server: %w", err)
	}
	return srv.Shutdown, nil
}

func (a *asynqSystem) cpu() (time.Duration, string, bool) {
	return SelfCPU(), "delaybench process: asynq server + load generator", true
}

func (a *asynqSystem) pid() int { return os.Getpid() }

// cleanup deletes every key of the run's queues; asynq's own server and
// worker records expire by themselves.
func (a *asynqSystem) cleanup(ctx context.Context, nss []string) error {
	var errs []error
	for _, ns := range nss {
		if _, err := baseline.DeleteMatching(ctx, a.rdb, "asynq:{"+ns+"}*"); err != nil {
			errs = append(errs, err)
		}
		if err := a.rdb.SRem(ctx, "asynq:queues", ns).Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
