package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/storage"
)

// guardInterval is how often an open Subscribe stream re-checks that its
// API key and its namespace still stand. The checks read the registry
// cache, whose lifetime (1 s by default) bounds how late a revocation or a
// deletion made on another replica is seen: a stream ends within about
// guardInterval + that lifetime.
const guardInterval = 200 * time.Millisecond

// streamGuard ends Subscribe streams whose API key was revoked or whose
// namespace was deleted — or deleted and re-created: a stream is tied to
// the namespace's incarnation (its create time) when it opened, not only to
// its name, so it never receives a later namespace's tasks once the change
// is seen.
type streamGuard struct {
	keys       func(ctx context.Context, id string) (storage.Key, error) // nil: no key check
	namespaces Tenancy
	interval   time.Duration
}

func newStreamGuard(opts Options) *streamGuard {
	g := &streamGuard{interval: guardInterval, namespaces: opts.Tenancy}
	if authEnabled(opts) {
		g.keys = opts.Tenancy.Key
	}
	return g
}

// errGuard marks a stream ended by the guard; its status is the cause.
var errGuard = errors.New("stream guard")

// guardStatus is the status a guard-ended stream answers.
type guardStatus struct{ st error }

func (g guardStatus) Error() string { return g.st.Error() }
func (g guardStatus) Unwrap() error { return errGuard }

// watch returns a context that is cancelled when p's key is revoked or ns
// stops being the namespace it is now, and stop, which ends the watch and
// must be called. Ended tells why (a status error) once ctx is cancelled by
// the guard, nil otherwise.
func (g *streamGuard) watch(ctx context.Context, p *principal, ns string) (_ context.Context, stop func(), ended func() error) {
	ctx, cancel := context.WithCancelCause(ctx)
	var created time.Time
	checkNS := true
	{
		n, err := g.namespaces.Lookup(ctx, ns)
		if err != nil {
			checkNS = false // the handler's own policy lookup answered for it
		} else {
			created = n.CreateTime
		}
	}
	checkKey := g.keys != nil && p != nil && p.keyID != adminKeyID
	var wg sync.WaitGroup
	if checkNS || checkKey {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(g.interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				// A check never waits long on the store: other requests
				// may be sharing its load (and, with the store down, it may
				// be the probe that waits the whole store timeout).
				cctx, ccancel := context.WithTimeout(ctx, g.interval/2)
				ended := g.check(cctx, p, ns, created, checkKey, checkNS)
				ccancel()
				if ended != nil {
					cancel(ended)
					return
				}
			}
		}()
	}
	stop = func() {
		cancel(nil)
		wg.Wait()
	}
	ended = func() error {
		var gs guardStatus
		if errors.As(context.Cause(ctx), &gs) {
			return gs.st
		}
		return nil
	}
	return ctx, stop, ended
}

// check returns the guardStatus that ends the stream, or nil while its key
// and its namespace's incarnation stand (or cannot be read: the stream goes
// on, and is checked again next time).
func (g *streamGuard) check(ctx context.Context, p *principal, ns string, created time.Time, checkKey, checkNS bool) error {
	if checkKey {
		if _, err := g.keys(ctx, p.keyID); errors.Is(err, storage.ErrNotFound) {
			return guardStatus{status.Errorf(codes.Unauthenticated, "API key %s was revoked; the stream is closed", p.keyID)}
		}
	}
	if checkNS {
		n, err := g.namespaces.Lookup(ctx, ns)
		if errors.Is(err, storage.ErrNotFound) || err == nil && !n.CreateTime.Equal(created) {
			return guardStatus{status.Errorf(codes.NotFound, "namespace %q was deleted; the stream is closed", ns)}
		}
	}
	return nil
}
