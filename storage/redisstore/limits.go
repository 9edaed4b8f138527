package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// This file holds what replicas share besides tasks: the per-namespace
// request-rate bucket and Subscribe stream count (storage.SharedLimits),
// and the announcements of settled deliveries on the wake-up channel.
//
// Keys, on the namespace's first shard (its hash tag {ns#0}):
//
//	delayd:{ns#0}:reqrate  HASH  request-rate token bucket (lua/ratetake.lua):
//	                             t = tokens, at = when (Redis µs); expires
//	                             once it would be full again
//	delayd:{ns#0}:subs     ZSET  Subscribe stream id -> lease end (Redis ms)
//	                             (lua/subscribers.lua); expires with the last
//	                             lease
//
// Wake-up message "settled:" + JSON array of tokens: deliveries an ack or
// nack settled on a replica whose streams did not hold them.

var _ storage.SharedLimits = (*Store)(nil)

// requestRateKey is ns's request-rate bucket.
func requestRateKey(ns string) string { return keyPrefix + hashTag(ns, 0) + ":reqrate" }

// subscribersKey is ns's set of Subscribe streams.
func subscribersKey(ns string) string { return keyPrefix + hashTag(ns, 0) + ":subs" }

// settledWakePrefix starts a wake-up message that carries settled tokens.
const settledWakePrefix = "settled:"

// TakeRequestToken implements storage.SharedLimits.
func (s *Store) TakeRequestToken(ctx context.Context, ns string, rate float64, burst int) (bool, error) {
	if err := storage.ValidateNamespace(ns); err != nil {
		return false, err
	}
	if !(rate > 0) {
		return true, nil
	}
	// lua/ratetake.lua, the dispatch-rate bucket's script outside a pop:
	// take one whole token, give none back.
	v, err := s.run(ctx, "request rate", scripts.rateTake, []string{requestRateKey(ns)},
		strconv.FormatFloat(rate, 'g', -1, 64), max(1, burst), 1, 0)
	if err != nil {
		return false, err
	}
	n, err := replyInt(v)
	if err != nil {
		return false, fmt.Errorf("request rate: %w", err)
	}
	return n == 1, nil
}

// subscribers runs lua/subscribers.lua.
func (s *Store) subscribers(ctx context.Context, ns, op string, lease time.Duration, most int, ids ...string) (bool, int, error) {
	if err := storage.ValidateNamespace(ns); err != nil {
		return false, 0, err
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, op, max(1, lease.Milliseconds()), max(0, most))
	for _, id := range ids {
		args = append(args, id)
	}
	rep, err := s.runRows(ctx, "subscribers "+op, scripts.subscribers, []string{subscribersKey(ns)}, fixed(2), args...)
	if err != nil {
		return false, 0, err
	}
	ok, err1 := replyInt(rep.head[0])
	held, err2 := replyInt(rep.head[1])
	if err1 != nil || err2 != nil {
		return false, 0, fmt.Errorf("subscribers %s: bad reply %v", op, rep)
	}
	return ok == 1, int(held), nil
}

// AcquireSubscriber implements storage.SharedLimits.
func (s *Store) AcquireSubscriber(ctx context.Context, ns, id string, most int, lease time.Duration) (bool, int, error) {
	return s.subscribers(ctx, ns, "acquire", lease, most, id)
}

// RenewSubscribers implements storage.SharedLimits.
func (s *Store) RenewSubscribers(ctx context.Context, ns string, ids []string, lease time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	_, _, err := s.subscribers(ctx, ns, "renew", lease, 0, ids...)
	return err
}

// ReleaseSubscriber implements storage.SharedLimits.
func (s *Store) ReleaseSubscriber(ctx context.Context, ns, id string) error {
	_, _, err := s.subscribers(ctx, ns, "release", time.Millisecond, 0, id)
	return err
}

// PublishSettled publishes on the wake-up channel that tokens of ns were
// settled (see storage.Wakeups): on a Redis Cluster, on the channel of
// ns's first shard, which every replica serving ns subscribes to.
func (s *Store) PublishSettled(ctx context.Context, ns string, tokens []storage.Token) error {
	if len(tokens) == 0 {
		return nil
	}
	msg, err := json.Marshal(tokens)
	if err != nil {
		return fmt.Errorf("publish settled: %w", err)
	}
	return s.publishWake(ctx, "publish settled", ns, settledWakePrefix+string(msg))
}

// parseSettled reads a "settled:" wake-up message; ok is false for another
// kind of message or a malformed one.
func parseSettled(m string) (storage.Wakeup, bool) {
	body, ok := strings.CutPrefix(m, settledWakePrefix)
	if !ok {
		return storage.Wakeup{}, false
	}
	var toks []storage.Token
	if err := json.Unmarshal([]byte(body), &toks); err != nil || len(toks) == 0 {
		return storage.Wakeup{}, false
	}
	return storage.Wakeup{Namespace: toks[0].Namespace, Settled: toks}, true
}
