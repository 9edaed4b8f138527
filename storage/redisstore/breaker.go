package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// breaker makes calls fail fast once Redis is known to be down (issue 10
// item 5): a Redis that hangs (SIGSTOP, a partition that drops packets)
// answers nothing, and without it every call would hold its caller for the
// whole store timeout. It is a go-redis hook on the client:
//
//   - a call that fails because Redis did not answer in time, or refused or
//     dropped the connection, marks Redis down for openFor;
//   - while it is down, calls fail at once with storage.ErrUnavailable
//     ("redis known down"), except one probe per openFor window, which goes
//     through: its success marks Redis up again, its failure keeps it down.
//
// A call that ran out of its caller's own (short) deadline is no evidence:
// only calls that waited at least tripAfter count.
type breaker struct {
	openFor   time.Duration
	tripAfter time.Duration

	mu      sync.Mutex
	down    bool
	until   time.Time // while down: fail fast before this
	probing bool
}

// errKnownDown is what a call gets while Redis is known to be down.
var errKnownDown = fmt.Errorf("redis known down, not asked: %w", storage.ErrUnavailable)

// admit reports whether a call may go to Redis, and whether it is the probe.
func (b *breaker) admit(now time.Time) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.down {
		return true, false
	}
	if now.Before(b.until) || b.probing {
		return false, false
	}
	b.probing = true
	return true, true
}

// done records a call's outcome.
func (b *breaker) done(err error, took time.Duration, probe bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	var re redis.Error
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.As(err, &re) && !unavailable(err):
		b.down = false // Redis answered
	case b.evidence(err, took):
		b.down = true
		b.until = now.Add(b.openFor)
	}
}

// evidence reports whether err says Redis is down (not a script error, not
// the caller giving up early).
func (b *breaker) evidence(err error, took time.Duration) bool {
	if errors.Is(err, redis.Nil) || errors.Is(err, errKnownDown) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	if timeout {
		return took >= b.tripAfter
	}
	return unavailable(err)
}

// probeKey marks the context of the probe, so the commands go-redis runs
// for it on a new connection (HELLO, AUTH, SELECT) are not refused.
type probeKey struct{}

// hook is the go-redis hook that applies the breaker to every command and
// pipeline of the client.
type breakerHook struct{ b *breaker }

func (h breakerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h breakerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(probeKey{}) != nil {
			return next(ctx, cmd) // a command of the probe's own (HELLO on its new connection)
		}
		start := time.Now()
		ok, probe := h.b.admit(start)
		if !ok {
			cmd.SetErr(errKnownDown)
			return errKnownDown
		}
		if probe {
			ctx = context.WithValue(ctx, probeKey{}, true)
		}
		err := next(ctx, cmd)
		h.b.done(err, time.Since(start), probe, time.Now())
		return err
	}
}

func (h breakerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(probeKey{}) != nil {
			return next(ctx, cmds)
		}
		start := time.Now()
		ok, probe := h.b.admit(start)
		if !ok {
			for _, c := range cmds {
				c.SetErr(errKnownDown)
			}
			return errKnownDown
		}
		if probe {
			ctx = context.WithValue(ctx, probeKey{}, true)
		}
		err := next(ctx, cmds)
		h.b.done(err, time.Since(start), probe, time.Now())
		return err
	}
}

// On a Redis Cluster one breaker for the whole client would turn one dead
// master into an outage of every shard: slotBreakers keeps a breaker per
// hash slot of the command's first key (a namespace shard is one slot), and
// one for commands without a key (PUBLISH, TIME). A failover moves a slot
// to the promoted replica; its breaker lets one probe through per openFor
// window and closes on the first answer.
type slotBreakers struct {
	openFor, tripAfter time.Duration
	mu                 sync.Mutex
	m                  map[int]*breaker // slot (-1: no key) -> breaker
}

func (s *slotBreakers) of(slot int) *breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[slot]
	if !ok {
		b = &breaker{openFor: s.openFor, tripAfter: s.tripAfter}
		s.m[slot] = b
	}
	return b
}

// cmdSlot is the slot of cmd's first key, -1 when it has none.
func cmdSlot(cmd redis.Cmder) int {
	args := cmd.Args()
	pos := 1
	switch strings.ToLower(cmd.Name()) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 4 || fmt.Sprint(args[2]) == "0" {
			return -1
		}
		pos = 3
	case "publish", "spublish", "subscribe", "psubscribe", "time", "ping", "info", "cluster", "hello", "auth", "select", "client", "command", "readonly":
		return -1
	}
	if len(args) <= pos {
		return -1
	}
	key, ok := args[pos].(string)
	if !ok {
		return -1
	}
	return keySlot(key)
}

// keySlot is the Redis Cluster slot of key (its hash tag's, if it has one).
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return slotOf(key)
}

// clusterBreakerHook applies slotBreakers to every command and pipeline of
// a ClusterClient (a pipeline goes by its first command's slot).
type clusterBreakerHook struct{ s *slotBreakers }

func (h clusterBreakerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clusterBreakerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return breakerHook{h.s.of(cmdSlot(cmd))}.ProcessHook(next)(ctx, cmd)
	}
}

func (h clusterBreakerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		slot := -1
		if len(cmds) > 0 {
			slot = cmdSlot(cmds[0])
		}
		return breakerHook{h.s.of(slot)}.ProcessPipelineHook(next)(ctx, cmds)
	}
}
