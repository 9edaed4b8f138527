package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// Conditional writes across replicas: two durable stores (two delayd
// replicas) on one MySQL and one Redis. Each replica's committer orders its
// own writes of a task, so only MySQL can decide between replicas; READ
// COMMITTED takes no lock on a missing row, so two create-only writes that
// both found no row must still not both apply.
func TestConditionalAcrossReplicas(t *testing.T) {
	dsn := testkit.Database(t, "delayd_test")
	a := newEnvOn(t, dsn, testkit.RedisURL(), nil)
	b := newEnvOn(t, dsn, testkit.RedisURL(), nil)
	stores := []storage.Tasks{a.store, b.store}
	ctx := context.Background()

	// run has 2×n writers (half on each replica) write at once, many
	// rounds on fresh ids; it fails the test unless exactly one writer of
	// each round applied.
	run := func(t *testing.T, rounds, n int, prepare func(ns, id string), write func(s storage.Tasks, ns, id string, i int) bool) {
		for r := range rounds {
			ns := "cond" + testkit.Suffix()
			id := fmt.Sprintf("task-%d", r)
			prepare(ns, id)
			var (
				mu   sync.Mutex
				won  []int
				wg   sync.WaitGroup
				gate = make(chan struct{})
			)
			for i := range 2 * n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					if write(stores[i%2], ns, id, i) {
						mu.Lock()
						won = append(won, i)
						mu.Unlock()
					}
				}()
			}
			close(gate)
			wg.Wait()
			if len(won) != 1 {
				t.Fatalf("round %d: %d writers applied (%v), want exactly 1", r, len(won), won)
			}
		}
	}

	t.Run("create-only", func(t *testing.T) {
		run(t, 20, 8, func(string, string) {}, func(s storage.Tasks, ns, id string, i int) bool {
			res, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: []byte(fmt.Sprint(i)), Delay: time.Hour, CreateOnly: true}})
			if err != nil {
				t.Errorf("writer %d: %v", i, err)
				return false
			}
			if res[0].Refused == storage.NotRefused && !res[0].Created {
				t.Errorf("writer %d: applied a create-only upsert without creating: %+v", i, res[0])
			}
			return res[0].Refused == storage.NotRefused
		})
	})
	t.Run("if-generation", func(t *testing.T) {
		run(t, 20, 8, func(ns, id string) {
			if _, err := a.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Delay: time.Hour}}); err != nil {
				t.Fatal(err)
			}
		}, func(s storage.Tasks, ns, id string, i int) bool {
			if i%4 == 3 {
				_, err := s.Remove(ctx, ns, id, storage.Version{Generation: 1})
				if err != nil && !errors.Is(err, storage.ErrGenerationMismatch) && !errors.Is(err, storage.ErrNotFound) {
					t.Errorf("writer %d: remove: %v", i, err)
				}
				return err == nil
			}
			res, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: []byte(fmt.Sprint(i)), Delay: time.Hour, IfGeneration: 1}})
			if err != nil {
				t.Errorf("writer %d: %v", i, err)
				return false
			}
			return res[0].Refused == storage.NotRefused
		})
	})
}

// TestRemoveTasksFallsBackToMySQL: with the namespace's index gone (no
// marker, no task: a Redis that restarted empty, before the rebuild), a
// filter is matched and removed in MySQL, page by page with a cursor of its
// own, and the tasks do not come back with the rebuild.
func TestRemoveTasksFallsBackToMySQL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.IndexCheckInterval = time.Hour })
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	var specs []storage.UpsertSpec
	for i := range 30 {
		kind := "order.close"
		if i%3 == 0 {
			kind = "order.remind"
		}
		specs = append(specs, storage.UpsertSpec{ID: fmt.Sprintf("o_%02d", i), Kind: kind, Delay: time.Hour})
	}
	specs = append(specs, storage.UpsertSpec{ID: "ox01", Kind: "order.close", Delay: time.Hour}) // "_" is no wildcard
	if _, err := e.store.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	if _, err := e.idx.DropNamespace(ctx, ns, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, "delayd:{"+ns+"#0}:indexed").Err(); err != nil {
		t.Fatal(err)
	}
	var removed int64
	pages := 0
	for cursor := ""; ; pages++ {
		res, err := e.store.RemoveTasks(ctx, ns, storage.RemoveTasksParams{
			Filter: storage.TaskFilter{Kind: "order.close", IDPrefix: "o_"}, Cursor: cursor, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		removed += res.Removed
		if cursor = res.Next; cursor == "" {
			break
		}
		if pages > 20 {
			t.Fatal("the walk does not end")
		}
	}
	if removed != 20 || pages < 2 {
		t.Fatalf("removed %d in %d pages, want 20 in at least 3", removed, pages+1)
	}
	var left, closes int
	if err := e.db.QueryRow("SELECT COUNT(*), COALESCE(SUM(kind = 'order.close'), 0) FROM delayd_tasks WHERE namespace = ?", ns).Scan(&left, &closes); err != nil {
		t.Fatal(err)
	}
	if left != 11 || closes != 1 {
		t.Fatalf("mysql holds %d tasks (%d order.close), want the 10 reminders and ox01", left, closes)
	}
}
