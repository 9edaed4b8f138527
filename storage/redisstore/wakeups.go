package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// Wake-ups (storage.Wakeups): the pub/sub channel scripts publish a
// namespace's changes on, and the policy-changed message.

// SubscribeWakeups calls fn with every wake-up published by any replica
// (an upsert, nack, reap, requeue or restore that put an earlier task at
// the head of a namespace; a policy change, PublishPolicyChanged) until
// ctx is done, and then returns ctx.Err(). It fails with
// storage.ErrUnavailable when the subscription cannot be made. fn runs on
// the subscribing goroutine, one call at a time, and should not block.
// After a connection loss the subscription is re-made in the background;
// wake-ups published meanwhile are lost, and ready is called again once
// Redis confirms the new subscription (see storage.Wakeups).
func (s *Store) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	// The context of Subscribe only bounds the first connection; later
	// reconnections are go-redis's own.
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	sub := s.rdb.Subscribe(rctx, s.wake)
	defer sub.Close()
	_, err := sub.Receive(rctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrapErr("subscribe wakeups", err)
	}
	ready()
	// With subscriptions: go-redis re-subscribes after a lost connection
	// and Redis confirms it, which is when wake-ups reach us again.
	ch := sub.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return fmt.Errorf("subscribe wakeups: %w: subscription closed", storage.ErrUnavailable)
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					ready()
				}
			case *redis.Message:
				fn(parseWakeMessage(m.Payload))
			}
		}
	}
}

// PublishPolicyChanged publishes on the wake-up channel that ns's policy
// changed, so every replica's dispatcher re-reads it at once.
func (s *Store) PublishPolicyChanged(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Publish(ctx, s.wake, policyWakeMessage(ns)).Err(); err != nil {
		return wrapErr("publish policy change", err)
	}
	return nil
}
