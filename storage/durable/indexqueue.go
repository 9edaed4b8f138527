package durable

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// The index side of committed writes runs apart from the committer, so a
// Redis that hangs (rather than refusing) never throttles MySQL commits
// (issue 10 item 5):
//
//	worker: MySQL commit ─▶ answer from MySQL ─▶ indexJob ─▶ shard queue ─▶ writer: index call ─▶ job done
//
// A committer worker turns each committed upsert or remove into an
// indexJob, pushes the jobs of its batch, in order, onto the queue of the
// job's namespace (one of Committers shards, by namespace hash), and only
// then lets the collector form the next batch touching the same tasks. So
// the index writes of one task are queued in commit order, and each shard's
// writer applies its queue in order: per namespace and per task, the index
// sees the writes in the order MySQL committed them.
//
// The caller is answered after the commit. It waits for its own job (see
// awaitIndex) only while the index is healthy, and only up to IndexWait or
// half of its remaining deadline; then it is answered from MySQL (an
// upsert: OK, it is durable; a remove: Unavailable, retry, since the task is
// still in the index and could be delivered). A job the index could not
// apply (an error, a "stale" answer) puts its tasks in the repair set,
// which this replica re-indexes from MySQL (repairFailed) as soon as the
// index answers; the reconciler's passes catch the rest.
//
// Each queue is bounded (indexQueueRows, indexQueueBytes): while a hung
// Redis holds a writer and the queue is full, committers wait. Once the
// index is known down (redisstore's breaker) its calls fail at once, so
// the queues drain into the repair set and commits go on at MySQL's speed.

// Bounds of one shard's index queue; one job larger than them is taken
// alone when its queue is empty.
const (
	indexQueueRows  = 32 << 10
	indexQueueBytes = 32 << 20
)

// relativeFresh is how soon after its commit a job must reach the index to
// keep a relative delay relative (the index resolves it against its own
// clock, as the caller who waited was told). A job that waited longer is
// written with the due time MySQL recorded, which a caller answered
// without waiting for the index was told.
const relativeFresh = 100 * time.Millisecond

// indexJob is the index side of one committed op.
type indexJob struct {
	kind      authority.WriteKind
	ns        string
	committed time.Time
	specs     []storage.UpsertSpec // kindUpsert, with the MySQL results
	absolute  []time.Time          // kindUpsert: each spec's due time as MySQL recorded it
	rows      []int                // kindUpsert: the op's row each spec is
	id        string               // kindRemove
	mysqlPrev storage.State        // kindRemove: the state MySQL held

	// Set by the writer before done is closed.
	res  []storage.UpsertResult // kindUpsert: the index's answer per spec
	ok   []bool                 // kindUpsert: res[i] is the index's own
	prev storage.State          // kindRemove
	err  error                  // the index call failed
	done chan struct{}
}

func (j *indexJob) size() (rows, bytes int) {
	if j.kind == kindRemove {
		return 1, len(j.id)
	}
	for _, sp := range j.specs {
		bytes += len(sp.Payload) + len(sp.ID) + len(sp.Kind)
	}
	return len(j.specs), bytes
}

// indexQueue is one shard's queue of jobs and what its writer knows of the
// index's health.
type indexQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	jobs   []*indexJob
	rows   int
	bytes  int
	closed bool
	// busySince is when the writer's current index call started (zero
	// while idle); failing is true from a failed call until one succeeds.
	busySince time.Time
	failing   bool
}

func newIndexQueue() *indexQueue {
	q := &indexQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push appends jobs in order, waiting while the queue is full.
func (q *indexQueue) push(jobs []*indexJob) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range jobs {
		r, b := j.size()
		for !q.closed && len(q.jobs) > 0 && (q.rows+r > indexQueueRows || q.bytes+b > indexQueueBytes) {
			q.cond.Wait()
		}
		q.jobs = append(q.jobs, j)
		q.rows += r
		q.bytes += b
	}
	q.cond.Broadcast()
}

// take waits for jobs and takes them all; nil once closed and empty.
func (q *indexQueue) take() []*indexJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.jobs) == 0 && !q.closed {
		q.cond.Wait()
	}
	jobs := q.jobs
	q.jobs, q.rows, q.bytes = nil, 0, 0
	q.cond.Broadcast()
	return jobs
}

// close lets the writer end once the queue is empty.
func (q *indexQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// healthy reports whether a caller should wait for its job: the last index
// call succeeded and none has been running for wait or longer.
func (q *indexQueue) healthy(now time.Time, wait time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.failing && (q.busySince.IsZero() || now.Sub(q.busySince) < wait)
}

func (q *indexQueue) calling(now time.Time) {
	q.mu.Lock()
	q.busySince = now
	q.mu.Unlock()
}

func (q *indexQueue) called(err error) {
	q.mu.Lock()
	q.busySince = time.Time{}
	q.failing = err != nil
	q.mu.Unlock()
}

// indexWriters are the index queues, one per committer by namespace
// hash, and their writers. Start them before the committer; Stop them
// after it (no op may push then): the writers apply what their queues hold
// and end.
type indexWriters struct {
	idx     Index
	log     *slog.Logger
	warn    *throttle
	repairs *repairSet // tasks whose index write failed

	maxBatch  int           // Config.MaxBatch: most specs of one index call
	opTimeout time.Duration // Config.OpTimeout: bounds each index call
	indexWait time.Duration // Config.IndexWait

	iq []*indexQueue
	wg sync.WaitGroup // the writers

	startOnce, stopOnce sync.Once
}

func newIndexWriters(idx Index, repairs *repairSet, warn *throttle, cfg Config) *indexWriters {
	w := &indexWriters{idx: idx, log: cfg.Logger, warn: warn, repairs: repairs,
		maxBatch: cfg.MaxBatch, opTimeout: cfg.OpTimeout, indexWait: cfg.IndexWait}
	for range cfg.Committers {
		w.iq = append(w.iq, newIndexQueue())
	}
	return w
}

// Start starts one writer per queue.
func (s *indexWriters) Start(context.Context) error {
	s.startOnce.Do(func() {
		s.wg.Add(len(s.iq))
		for _, q := range s.iq {
			go func() {
				defer s.wg.Done()
				for s.runOnce(q) {
				}
			}()
		}
	})
	return nil
}

// Stop closes the queues and waits until the writers applied what they
// hold, or for ctx. Call it once nothing pushes any more (the committer
// stopped).
func (s *indexWriters) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		for _, q := range s.iq {
			q.close()
		}
	})
	return waitCtx(ctx, s.wg.Wait)
}

// queueOf is the shard queue of ns.
func (s *indexWriters) queueOf(ns string) *indexQueue {
	h := fnv.New32a()
	_, _ = h.Write([]byte(ns))
	return s.iq[int(h.Sum32()%uint32(len(s.iq)))]
}

// enqueue pushes jobs, in order, onto their namespaces' queues.
func (s *indexWriters) enqueue(jobs []*indexJob) {
	if len(jobs) == 0 {
		return
	}
	byQ := map[*indexQueue][]*indexJob{}
	var order []*indexQueue
	for _, j := range jobs {
		q := s.queueOf(j.ns)
		if _, ok := byQ[q]; !ok {
			order = append(order, q)
		}
		byQ[q] = append(byQ[q], j)
	}
	for _, q := range order {
		q.push(byQ[q])
	}
}

// runOnce takes the jobs q holds (waiting for some) and applies them in
// order: a run of upserts of one namespace in one index call (at most
// MaxBatch specs), each remove alone. It reports false, having done
// nothing, once q is closed and empty.
func (s *indexWriters) runOnce(q *indexQueue) bool {
	jobs := q.take()
	if jobs == nil {
		return false
	}
	for i := 0; i < len(jobs); {
		j := jobs[i]
		if j.kind == kindRemove {
			s.applyRemove(q, j)
			i++
			continue
		}
		k, n := i+1, len(j.specs)
		for k < len(jobs) && jobs[k].kind == kindUpsert && jobs[k].ns == j.ns && n+len(jobs[k].specs) <= s.maxBatch {
			n += len(jobs[k].specs)
			k++
		}
		s.applyUpserts(q, jobs[i:k])
		i = k
	}
	return true
}

// applyUpserts writes the upsert jobs of one namespace in one index call
// and completes them. Specs are written with their MySQL version; a job
// that waited past relativeFresh has its relative delays made absolute (the
// due time MySQL recorded). On failure, and for every spec the index
// answers "stale", the tasks go to the repair set.
func (s *indexWriters) applyUpserts(q *indexQueue, jobs []*indexJob) {
	ns := jobs[0].ns
	now := time.Now()
	var specs []storage.UpsertSpec
	for _, j := range jobs {
		for i, sp := range j.specs {
			if sp.DueTime.IsZero() && now.Sub(j.committed) >= relativeFresh {
				sp.DueTime, sp.Delay = j.absolute[i], 0
			}
			specs = append(specs, sp)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opTimeout)
	q.calling(now)
	res, err := s.idx.Upsert(ctx, ns, specs)
	cancel()
	if err == nil && len(res) != len(specs) {
		err = fmt.Errorf("index answered %d results for %d specs", len(res), len(specs))
	}
	q.called(unavailableOnly(err))
	if err != nil {
		s.warn.warn("index-write", "index write failed after the mysql commit; the tasks are durable and will be re-indexed",
			"namespace", ns, "tasks", len(specs), "err", err)
		ids := make([]string, len(specs))
		for i, sp := range specs {
			ids[i] = sp.ID
		}
		s.repairs.add(ns, ids)
		for _, j := range jobs {
			j.err = err
			close(j.done)
		}
		return
	}
	var stale []string
	at := 0
	for _, j := range jobs {
		j.res = make([]storage.UpsertResult, len(j.specs))
		j.ok = make([]bool, len(j.specs))
		for i := range j.specs {
			r := res[at]
			at++
			if r.Stale {
				// The index holds a version MySQL did not just commit as
				// the newest: a concurrent newer write (harmless), or a
				// version MySQL never had or no longer has (a restored
				// snapshot, a promoted lagging replica). Either way the
				// task is repaired from MySQL, which wins, so it is never
				// left hidden.
				stale = append(stale, j.specs[i].ID)
				continue
			}
			j.res[i], j.ok[i] = r, true
		}
		close(j.done)
	}
	if len(stale) > 0 {
		s.log.Info("the index held a newer version than mysql just committed; repairing from mysql", "namespace", ns, "tasks", len(stale))
		s.repairs.add(ns, stale)
	}
}

// applyRemove removes one task from the index after its MySQL delete. A
// failure puts the task in the repair set, which forgets the index's entry
// once MySQL confirms the task is gone.
func (s *indexWriters) applyRemove(q *indexQueue, j *indexJob) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opTimeout)
	q.calling(time.Now())
	st, err := s.idx.Remove(ctx, j.ns, j.id, storage.Version{})
	cancel()
	switch {
	case err == nil:
		q.called(nil)
		j.prev = st
	case errors.Is(err, storage.ErrNotFound):
		q.called(nil)
		j.prev = storage.StateUnspecified
	default:
		q.called(unavailableOnly(err))
		j.err = err
		s.warn.warn("index-remove", "index remove failed after the mysql delete; the index entry will be forgotten",
			"namespace", j.ns, "err", err)
		s.repairs.add(j.ns, []string{j.id})
	}
	close(j.done)
}

// unavailableOnly is err when it says the index cannot serve (which makes
// callers stop waiting for the index), else nil.
func unavailableOnly(err error) error {
	if err != nil && (errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	return nil
}

// waitBound bounds a write's wait for the index: IndexWait and half of
// what is left of ctx's deadline at now (a hung index must not hold it).
func (s *indexWriters) waitBound(ctx context.Context, now time.Time) time.Duration {
	wait := s.indexWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, dl.Sub(now)/2)
	}
	return wait
}

// indexBudget is how long a write of ns may wait for the index now: its
// waitBound while the namespace's index queue is healthy, else 0.
func (s *indexWriters) indexBudget(ctx context.Context, ns string) time.Duration {
	now := time.Now()
	if !s.queueOf(ns).healthy(now, s.indexWait) {
		return 0
	}
	return s.waitBound(ctx, now)
}

// awaitIndex waits for j while its queue is healthy, up to IndexWait and
// half of what is left of ctx's deadline; it reports whether j is done.
func (s *indexWriters) awaitIndex(ctx context.Context, j *indexJob) bool {
	select {
	case <-j.done:
		return true
	default:
	}
	wait := s.indexBudget(ctx, j.ns)
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-j.done:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}
