package dispatcher

import "github.com/delayd/delayd/storage"

// signals let a test wait for what the loops did instead of sleeping: each
// hook is called when its event has happened, on the goroutine that made it
// happen (so it must not block). A test sets them on a Config through
// export_test.go; in production they are nil and calling them does nothing.
type signals struct {
	onPlanned       func(ns string, pol storage.Policy, p plan) // a namespace loop round planned its next wake
	onPusherStopped func(ns string)                             // a namespace's pusher has stopped (push turned off)
	onDraining      func()                                      // Stop began waiting for pushes in flight
}

func (s signals) planned(ns string, pol storage.Policy, p plan) {
	if s.onPlanned != nil {
		s.onPlanned(ns, pol, p)
	}
}

func (s signals) pusherStopped(ns string) {
	if s.onPusherStopped != nil {
		s.onPusherStopped(ns)
	}
}

func (s signals) draining() {
	if s.onDraining != nil {
		s.onDraining()
	}
}
