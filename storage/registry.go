package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// GlobalNamespace is the Namespace of a global API key: one that applies to
// every namespace (operators' keys, the bootstrap admin key).
const GlobalNamespace = "*"

// Scope is what an API key may do in its namespace.
type Scope uint8

// Key scopes. The edge converts them to and from delayd.v1.KeyScope by
// name (server/wire).
const (
	ScopeUnspecified Scope = iota
	// ScopeProduce: UpsertTask, BatchUpsertTasks, RemoveTask, GetTask, ListTasks.
	ScopeProduce
	// ScopeConsume: Subscribe, AckTasks, NackTasks, ExtendLease.
	ScopeConsume
	// ScopeAdmin: NamespaceService RPCs on the namespace (namespace, keys,
	// dead letters, stats).
	ScopeAdmin
)

// String returns the scope's name in lower case ("produce", ...).
func (s Scope) String() string {
	switch s {
	case ScopeProduce:
		return "produce"
	case ScopeConsume:
		return "consume"
	case ScopeAdmin:
		return "admin"
	default:
		return "unspecified"
	}
}

// Namespace is a tenant's queue as the registry stores it.
type Namespace struct {
	// Name is the namespace name ([a-z0-9][a-z0-9_-]{0,62}).
	Name string
	// Policy as configured: a zero field means "the server default"; the
	// tenancy layer fills defaults in before anything uses it.
	Policy Policy
	// CreateTime is when the namespace was created (set by the registry).
	CreateTime time.Time
	// UpdateTime is when the namespace was last changed (set by the registry).
	UpdateTime time.Time
}

// Incarnation names this life of the namespace: its create time in Unix
// milliseconds (0, unchecked, when the registry gave none). A namespace
// re-created under a deleted one's name is a later incarnation: upserts,
// task history and recent figures are tied to it, so nothing of the old
// one reaches the new.
func (n Namespace) Incarnation() int64 {
	if n.CreateTime.IsZero() {
		return 0
	}
	return n.CreateTime.UnixMilli()
}

// Key is an API key as the registry stores it: never the secret, only its
// hash.
type Key struct {
	// ID is the public part of the key; unique across the registry.
	ID string
	// Namespace the key is for; GlobalNamespace ("*") for a global key.
	Namespace string
	// Scopes the key grants in Namespace; at least one.
	Scopes []Scope
	// Description is free text for operators.
	Description string
	// CreateTime is when the key was created (set by the caller).
	CreateTime time.Time
	// Hash is the SHA-256 of the secret. The secret itself is never stored.
	Hash []byte
}

// KeyCursor names the last key of a ListKeys page; the next page starts
// after it. The zero KeyCursor starts at the newest key.
type KeyCursor struct {
	// CreateTime of the key, millisecond precision.
	CreateTime time.Time
	ID         string
}

// IsZero reports whether c starts at the newest key.
func (c KeyCursor) IsZero() bool { return c.ID == "" }

// CursorOf returns the cursor that continues after k.
func CursorOf(k Key) KeyCursor { return KeyCursor{CreateTime: k.CreateTime, ID: k.ID} }

// HasScope reports whether k grants s.
func (k Key) HasScope(s Scope) bool {
	for _, have := range k.Scopes {
		if have == s {
			return true
		}
	}
	return false
}

// Registry stores namespaces and API keys. Implementations: redisstore
// (Redis-only and embedded modes) and mysqlstore (durable mode). Every
// method is safe for concurrent use and bounded by the store's per-call
// timeout; connection failures are wrapped with ErrUnavailable.
type Registry interface {
	// CreateNamespace stores a new namespace; CreateTime and UpdateTime are
	// set to the store's now and returned. ErrAlreadyExists if it exists.
	CreateNamespace(ctx context.Context, ns Namespace) (Namespace, error)
	// GetNamespace returns one namespace. ErrNotFound if it does not exist.
	GetNamespace(ctx context.Context, name string) (Namespace, error)
	// ListNamespaces returns up to limit namespaces in name order whose
	// names sort after `after` ("" = from the start). more is true when
	// further namespaces follow the last one returned.
	ListNamespaces(ctx context.Context, after string, limit int) (nss []Namespace, more bool, err error)
	// UpdateNamespace replaces the policy of a namespace with what update
	// returns when given the current one, atomically: a concurrent update
	// makes the implementation call update again with the newer policy. An
	// error from update is returned unchanged and nothing is written.
	// ErrNotFound if the namespace does not exist.
	UpdateNamespace(ctx context.Context, name string, update func(Policy) (Policy, error)) (Namespace, error)
	// DeleteNamespace deletes a namespace record and every API key of that
	// namespace. It does not touch tasks (the caller deals with them first).
	// ErrNotFound if it does not exist.
	DeleteNamespace(ctx context.Context, name string) error

	// CreateKey stores a new key. ErrAlreadyExists if the id is taken.
	CreateKey(ctx context.Context, k Key) error
	// GetKey returns one key by id. ErrNotFound if there is none.
	GetKey(ctx context.Context, id string) (Key, error)
	// ListKeys returns up to limit keys of one namespace (GlobalNamespace
	// for the global keys), newest first (create time, then id, both
	// descending), starting after the key `after` names (the zero
	// KeyCursor: from the newest). more is true when further keys follow
	// the last one returned.
	ListKeys(ctx context.Context, ns string, after KeyCursor, limit int) (keys []Key, more bool, err error)
	// RevokeKey deletes a key. ErrNotFound if there is none.
	RevokeKey(ctx context.Context, id string) error
}

// WithDefaults returns p with every zero field taken from defaults. A zero
// RateBurst with a positive RateLimit becomes the rate rounded up, at least
// 1. Limits whose zero means "unlimited" (MaxPendingTasks, RateLimit) take
// the default's value, which is normally unlimited too; MaxSubscribers
// takes the default's (100 unless the server is configured otherwise).
func (p Policy) WithDefaults(defaults Policy) Policy {
	if p.AckTimeout <= 0 {
		p.AckTimeout = defaults.AckTimeout
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = defaults.MaxAttempts
	}
	if p.Backoff.Initial <= 0 {
		p.Backoff.Initial = defaults.Backoff.Initial
	}
	if p.Backoff.Max <= 0 {
		p.Backoff.Max = defaults.Backoff.Max
	}
	if p.Backoff.Multiplier <= 0 {
		p.Backoff.Multiplier = defaults.Backoff.Multiplier
	}
	if p.Backoff.Jitter <= 0 {
		p.Backoff.Jitter = defaults.Backoff.Jitter
	}
	if p.MaxPayloadBytes <= 0 {
		p.MaxPayloadBytes = defaults.MaxPayloadBytes
	}
	if p.MaxPendingTasks <= 0 {
		p.MaxPendingTasks = defaults.MaxPendingTasks
	}
	if p.RateLimit <= 0 {
		p.RateLimit = defaults.RateLimit
		if p.RateBurst <= 0 {
			p.RateBurst = defaults.RateBurst
		}
	}
	if p.RateLimit > 0 && p.RateBurst <= 0 {
		p.RateBurst = int(math.Max(1, math.Ceil(p.RateLimit)))
	}
	if p.MaxSubscribers <= 0 {
		p.MaxSubscribers = defaults.MaxSubscribers
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = defaults.MaxDelay
	}
	if p.Shards <= 0 {
		p.Shards = max(defaults.Shards, 1)
	}
	if p.MaxSchedules <= 0 {
		p.MaxSchedules = defaults.MaxSchedules
	}
	return p
}

// policyRecord is Policy's stored form: durations in milliseconds, field
// names fixed, zero fields omitted (a zero field means "server default").
type policyRecord struct {
	AckTimeoutMS      int64   `json:"ack_timeout_ms,omitempty"`
	MaxAttempts       int32   `json:"max_attempts,omitempty"`
	BackoffInitialMS  int64   `json:"backoff_initial_ms,omitempty"`
	BackoffMaxMS      int64   `json:"backoff_max_ms,omitempty"`
	BackoffMultiplier float64 `json:"backoff_multiplier,omitempty"`
	BackoffJitter     float64 `json:"backoff_jitter,omitempty"`
	MaxPayloadBytes   int     `json:"max_payload_bytes,omitempty"`
	MaxPendingTasks   int64   `json:"max_pending_tasks,omitempty"`
	RateLimit         float64 `json:"rate_limit,omitempty"`
	RateBurst         int     `json:"rate_burst,omitempty"`
	MaxSubscribers    int     `json:"max_subscribers,omitempty"`
	MaxDelayMS        int64   `json:"max_delay_ms,omitempty"`
	Paused            bool    `json:"paused,omitempty"`
	MaxDispatchRate   float64 `json:"max_dispatch_rate,omitempty"`
	Shards            int     `json:"shards,omitempty"`
	PushURL           string  `json:"push_url,omitempty"`
	PushSecret        string  `json:"push_secret,omitempty"`
	HistoryBytes      int64   `json:"history_retention_bytes,omitempty"`
	MaxSchedules      int     `json:"max_schedules,omitempty"`
}

// MarshalPolicy encodes p as the JSON document registries store: durations
// in whole milliseconds, zero fields omitted. It is stable across releases:
// fields are only ever added.
func MarshalPolicy(p Policy) ([]byte, error) {
	return json.Marshal(policyRecord{
		AckTimeoutMS:      p.AckTimeout.Milliseconds(),
		MaxAttempts:       p.MaxAttempts,
		BackoffInitialMS:  p.Backoff.Initial.Milliseconds(),
		BackoffMaxMS:      p.Backoff.Max.Milliseconds(),
		BackoffMultiplier: p.Backoff.Multiplier,
		BackoffJitter:     p.Backoff.Jitter,
		MaxPayloadBytes:   p.MaxPayloadBytes,
		MaxPendingTasks:   p.MaxPendingTasks,
		RateLimit:         p.RateLimit,
		RateBurst:         p.RateBurst,
		MaxSubscribers:    p.MaxSubscribers,
		MaxDelayMS:        p.MaxDelay.Milliseconds(),
		Paused:            p.Paused,
		MaxDispatchRate:   p.MaxDispatchRate,
		Shards:            p.Shards,
		PushURL:           p.Push.URL,
		PushSecret:        p.Push.Secret,
		HistoryBytes:      p.HistoryRetentionBytes,
		MaxSchedules:      p.MaxSchedules,
	})
}

// UnmarshalPolicy decodes what MarshalPolicy produced. Unknown fields are
// ignored, so an older binary reads a newer record.
func UnmarshalPolicy(b []byte) (Policy, error) {
	var r policyRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Policy{}, fmt.Errorf("decode policy: %w", err)
	}
	return Policy{
		AckTimeout:  time.Duration(r.AckTimeoutMS) * time.Millisecond,
		MaxAttempts: r.MaxAttempts,
		Backoff: Backoff{
			Initial:    time.Duration(r.BackoffInitialMS) * time.Millisecond,
			Max:        time.Duration(r.BackoffMaxMS) * time.Millisecond,
			Multiplier: r.BackoffMultiplier,
			Jitter:     r.BackoffJitter,
		},
		MaxPayloadBytes:       r.MaxPayloadBytes,
		MaxPendingTasks:       r.MaxPendingTasks,
		RateLimit:             r.RateLimit,
		RateBurst:             r.RateBurst,
		MaxSubscribers:        r.MaxSubscribers,
		MaxDelay:              time.Duration(r.MaxDelayMS) * time.Millisecond,
		Paused:                r.Paused,
		MaxDispatchRate:       r.MaxDispatchRate,
		Shards:                r.Shards,
		Push:                  PushTarget{URL: r.PushURL, Secret: r.PushSecret},
		HistoryRetentionBytes: r.HistoryBytes,
		MaxSchedules:          r.MaxSchedules,
	}, nil
}
