package durable_test

import (
	"testing"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storetest"
)

// TestConformance runs the shared store suite against the durable store:
// one database for the run, a store and a namespace per subtest.
func TestConformance(t *testing.T) {
	dsn := testkit.Database(t, "delayd_test")
	storetest.Run(t, func(t *testing.T) storage.Store {
		return newEnvOn(t, dsn, testkit.RedisURL(), nil).store
	})
}

// TestConformanceHistory runs the history and forecast suite against the
// durable store: events in MySQL, the forecast from the Redis index.
func TestConformanceHistory(t *testing.T) {
	dsn := testkit.Database(t, "delayd_test")
	storetest.RunHistory(t, func(t *testing.T) storetest.HistoryStore {
		return newEnvOn(t, dsn, testkit.RedisURL(), nil).store
	})
}

// TestConformanceSchedules runs the schedule suite against the durable
// store: schedules and their firings in MySQL, the firings in the index.
func TestConformanceSchedules(t *testing.T) {
	dsn := testkit.Database(t, "delayd_test")
	storetest.RunSchedules(t, 1, func(t *testing.T) storetest.ScheduleStore {
		return newEnvOn(t, dsn, testkit.RedisURL(), nil).store
	})
}
