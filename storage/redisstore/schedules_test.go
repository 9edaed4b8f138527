package redisstore

import (
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storetest"
)

// TestScheduleNamespaceSet: the loop's set of namespaces with schedules
// holds a namespace while it has one, and loses it once the loop finds it
// has none, so the set does not grow with every namespace that ever had a
// schedule; a schedule created again brings it back.
func TestScheduleNamespaceSet(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	s := New(c, Options{})
	ctx := t.Context()
	ns := storetest.Namespace(t)
	t.Cleanup(func() { _, _ = s.DropSchedules(ctx, ns) })
	member := func() bool {
		t.Helper()
		ok, err := c.SIsMember(ctx, scheduleNamespacesKey, ns).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	sc := storage.Schedule{Namespace: ns, ID: "a", Every: time.Minute}
	if _, err := s.CreateSchedule(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DueSchedules(ctx, 10); err != nil || !member() {
		t.Fatalf("with a schedule: member %v, %v", member(), err)
	}
	if err := s.DeleteSchedule(ctx, ns, "a", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DueSchedules(ctx, 10); err != nil || member() {
		t.Fatalf("without schedules, after a look: member %v, %v", member(), err)
	}
	if _, err := s.CreateSchedule(ctx, sc); err != nil || !member() {
		t.Fatalf("created again: member %v, %v", member(), err)
	}
}
