package redisstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// PublishWatchCopies publishes each copy on its namespace's watch channel
// (delayd:watch:<ns>) in one pipeline and returns PUBLISH's answer per copy:
// how many subscriptions, on any replica, received it. The copy travels as
// JSON (storage.WatchCopy's fields), so replicas of different versions read
// each other's copies.
func (s *Store) PublishWatchCopies(ctx context.Context, copies []storage.WatchCopy) ([]int64, error) {
	if len(copies) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(copies))
	for i, c := range copies {
		c.Task.Namespace = "" // the channel names it
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("publish watch copies: %w", err)
		}
		cmds[i] = pipe.Publish(ctx, watchChannel(copies[i].Task.Namespace), b)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, wrapErr("publish watch copies", err)
	}
	out := make([]int64, len(cmds))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// SubscribeWatchCopies subscribes to ns's watch channel on its own
// connection; see storage.DeliveryFeed. After a connection loss go-redis
// re-subscribes in the background; copies published meanwhile are lost.
// A message that is not a copy is logged and skipped.
func (s *Store) SubscribeWatchCopies(ctx context.Context, ns string, ready func() error, fn func(storage.WatchCopy) error) error {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	sub := s.rdb.Subscribe(rctx, watchChannel(ns))
	defer sub.Close()
	_, err := sub.Receive(rctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrapErr("subscribe watch copies", err)
	}
	if err := ready(); err != nil {
		return err
	}
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return fmt.Errorf("subscribe watch copies: %w: subscription closed", storage.ErrUnavailable)
			}
			var c storage.WatchCopy
			if err := json.Unmarshal([]byte(m.Payload), &c); err != nil {
				s.log.Warn("watch channel: a message that is not a delivery copy", "namespace", ns, "err", err)
				continue
			}
			c.Task.Namespace = ns
			if err := fn(c); err != nil {
				return err
			}
		}
	}
}
