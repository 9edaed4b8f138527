package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Clock is the Redis server's clock as seen from this process: delayd
// decides due-ness by Redis TIME, so lateness and early deliveries are
// judged by it too.
type Clock struct {
	// Offset is Redis time minus local time.
	Offset time.Duration `json:"offset_ns"`
	// Uncertainty bounds the error of Offset: half the round trip of the
	// best sample.
	Uncertainty time.Duration `json:"uncertainty_ns"`
}

// Now returns the current time by the Redis clock.
func (c Clock) Now() time.Time { return time.Now().Add(c.Offset) }

// At converts a local time to Redis time.
func (c Clock) At(local time.Time) time.Time { return local.Add(c.Offset) }

// MeasureClock estimates the offset of the Redis clock with samples TIME
// round trips and keeps the one with the shortest round trip, assuming the
// server read its clock half-way through it.
func MeasureClock(ctx context.Context, rdb redis.UniversalClient, samples int) (Clock, error) {
	if samples < 1 {
		samples = 1
	}
	best := Clock{Uncertainty: time.Hour}
	for range samples {
		t0 := time.Now()
		rt, err := rdb.Time(ctx).Result()
		t1 := time.Now()
		if err != nil {
			return Clock{}, fmt.Errorf("measure clock: %w", err)
		}
		rtt := t1.Sub(t0)
		if rtt/2 < best.Uncertainty {
			mid := t0.Add(rtt / 2)
			best = Clock{Offset: rt.Sub(mid), Uncertainty: rtt / 2}
		}
	}
	return best, nil
}
