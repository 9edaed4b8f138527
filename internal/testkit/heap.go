package testkit

import (
	"runtime/metrics"
	"time"
)

// HeapPeak starts sampling this process's live heap (the bytes of heap
// objects, every millisecond) and returns stop, which ends the sampling and
// reports the highest sample and the bytes allocated since HeapPeak was
// called. A sample can miss a peak shorter than a millisecond; the bytes
// allocated bound it from above.
func HeapPeak() (stop func() (peak, allocated uint64)) {
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(samples)
	allocs0 := samples[1].Value.Uint64()
	var peak uint64
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples[:1])
			peak = max(peak, samples[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		<-finished
		metrics.Read(samples)
		return peak, samples[1].Value.Uint64() - allocs0
	}
}
