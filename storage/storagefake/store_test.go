package storagefake_test

import (
	"testing"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/registrytest"
	"github.com/delayd/delayd/storage/storagefake"
	"github.com/delayd/delayd/storage/storetest"
)

// The fake keeps the contract the real stores keep: it passes their
// conformance suite, so a layer tested on it is tested against that contract.
func TestConformance(t *testing.T) {
	s := storagefake.New(nil)
	storetest.Run(t, func(t *testing.T) storage.Store { return s })
	storetest.RunWakeups(t, func(t *testing.T) storetest.WakeupStore { return s })
	storetest.RunHistory(t, func(t *testing.T) storetest.HistoryStore { return s })
	storetest.RunSchedules(t, 1, func(t *testing.T) storetest.ScheduleStore { return s })
}

func TestRegistryConformance(t *testing.T) {
	r := storagefake.NewRegistry(nil)
	registrytest.Run(t, func(t *testing.T) storage.Registry { return r })
}
