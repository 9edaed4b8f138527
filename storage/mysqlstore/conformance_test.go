package mysqlstore_test

import (
	"testing"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/registrytest"
	"github.com/delayd/delayd/storage/storetest"
)

// TestConformance runs the shared store suite against the durable store:
// one database for the run, a store and a namespace per subtest.
func TestConformance(t *testing.T) {
	dsn := newDB(t)
	storetest.Run(t, func(t *testing.T) storetest.Store {
		return newEnvOn(t, dsn, redisURL(), nil).store
	})
}

// TestRegistryConformance runs the shared registry suite against the MySQL
// registry, each subtest on a database of its own (the suite lists every
// namespace).
func TestRegistryConformance(t *testing.T) {
	registrytest.Run(t, func(t *testing.T) storage.Registry {
		return newEnv(t, nil).store
	})
}
