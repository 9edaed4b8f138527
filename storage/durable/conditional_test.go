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
