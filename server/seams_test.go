package server_test

import (
	"testing"

	"context"
	"github.com/delayd/delayd/schedule"
	"github.com/delayd/delayd/storage/storagefake"

	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage"
)

// staticTenancy serves one policy for every namespace and knows no API
// keys, for tests of the task and delivery RPCs with auth off. It holds no
// namespaces: the embedded Registry is nil, so those tests must not call
// the namespace and key RPCs (tenEnv runs them over a real registry).
type staticTenancy struct {
	storage.Registry
	policy storage.Policy
}

var _ server.Tenancy = staticTenancy{}

func (s staticTenancy) Key(context.Context, string) (storage.Key, error) {
	return storage.Key{}, storage.ErrNotFound
}

func (s staticTenancy) Defaults() storage.Policy { return s.policy }

func (s staticTenancy) Namespace(_ context.Context, ns string, _ bool) (storage.Namespace, error) {
	return storage.Namespace{Name: ns, Policy: s.policy}, nil
}

func (s staticTenancy) ForgetNamespace(string) {}

// newScheduler is the scheduler a test server runs its ScheduleService
// on: the fake store's schedules and tasks, and the test's tenancy.
func newScheduler(t *testing.T, store *storagefake.Store, ns schedule.Namespaces) *schedule.Scheduler {
	t.Helper()
	s, err := schedule.New(schedule.Config{Schedules: store, Tasks: store, Namespaces: ns, History: store})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
