package server

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// This file is the NamespacePolicy table: each field's update-mask name,
// whether it is a quota, how it is read from the wire (validated, with the
// error that names the field and what is allowed) and how two effective
// values compare. The rows are built by small typed helpers (policyDurationField,
// intField, floatField, boolField), so a new field of a known kind is one
// line; CreateNamespace and UpdateNamespace (namespace_admin.go) read the
// table.

// policyField is one NamespacePolicy field: its update-mask name, whether
// only a global admin may change it, how to read it from the wire
// (validated; zero = server default) and how to compare effective values.
type policyField struct {
	name  string
	quota bool
	set   func(dst *storage.Policy, src *delaydv1.NamespacePolicy, field string) error
	same  func(a, b storage.Policy) bool
}

// Policy field ranges. Zero always means "the server default".
const (
	minAckTimeout   = time.Second
	maxAckTimeout   = 12 * time.Hour
	maxMaxAttempts  = 1000
	minBackoff      = time.Millisecond
	maxBackoff      = 24 * time.Hour
	maxMultiplier   = 10
	maxPayloadLimit = 4 << 20
	maxPendingLimit = 1_000_000_000_000
	maxRateLimit    = 1_000_000
	maxRateBurst    = 1_000_000
	maxSubscribers  = 100_000
	maxSchedules    = 100_000
	maxDispatchRate = 1_000_000
	minMaxDelay     = time.Second
	maxMaxDelay     = 3660 * 24 * time.Hour
	// Push target bounds: the URL (the allow list checks it further) and
	// the HMAC secret.
	maxPushURLBytes    = 2048
	minPushSecretBytes = 16
	maxPushSecretBytes = 1024
)

// The kinds of a field's quota flag, for the table's readability.
const (
	quota    = true
	notQuota = false
)

var policyFields = []policyField{
	policyDurationField("ack_timeout", notQuota, (*delaydv1.NamespacePolicy).GetAckTimeout,
		func(p *storage.Policy) *time.Duration { return &p.AckTimeout }, minAckTimeout, maxAckTimeout, "1s-12h"),
	intField("max_attempts", notQuota, (*delaydv1.NamespacePolicy).GetMaxAttempts,
		func(p *storage.Policy) *int32 { return &p.MaxAttempts }, 1, maxMaxAttempts,
		fmt.Sprintf("1-%d, or 0 for the server default", maxMaxAttempts)),
	policyDurationField("backoff_initial", notQuota, (*delaydv1.NamespacePolicy).GetBackoffInitial,
		func(p *storage.Policy) *time.Duration { return &p.Backoff.Initial }, minBackoff, maxBackoff, "1ms-24h"),
	policyDurationField("backoff_max", notQuota, (*delaydv1.NamespacePolicy).GetBackoffMax,
		func(p *storage.Policy) *time.Duration { return &p.Backoff.Max }, minBackoff, maxBackoff, "1ms-24h"),
	floatField("backoff_multiplier", notQuota, (*delaydv1.NamespacePolicy).GetBackoffMultiplier,
		func(p *storage.Policy) *float64 { return &p.Backoff.Multiplier }, 1, maxMultiplier,
		fmt.Sprintf("1-%d, or 0 for the server default", maxMultiplier)),
	intField("max_payload_bytes", quota, (*delaydv1.NamespacePolicy).GetMaxPayloadBytes,
		func(p *storage.Policy) *int { return &p.MaxPayloadBytes }, 1, maxPayloadLimit,
		fmt.Sprintf("1-%d (4 MiB), or 0 for the server default", maxPayloadLimit)),
	intField("max_pending_tasks", quota, (*delaydv1.NamespacePolicy).GetMaxPendingTasks,
		func(p *storage.Policy) *int64 { return &p.MaxPendingTasks }, 1, maxPendingLimit,
		fmt.Sprintf("1-%d, or 0 for unlimited", int64(maxPendingLimit))),
	floatField("rate_limit", quota, (*delaydv1.NamespacePolicy).GetRateLimit,
		func(p *storage.Policy) *float64 { return &p.RateLimit }, 0, maxRateLimit,
		fmt.Sprintf("0-%d requests per second (0 = unlimited)", maxRateLimit)),
	intField("rate_burst", quota, (*delaydv1.NamespacePolicy).GetRateBurst,
		func(p *storage.Policy) *int { return &p.RateBurst }, 1, maxRateBurst,
		fmt.Sprintf("1-%d, or 0 for rate_limit rounded up", maxRateBurst)),
	intField("max_subscribers", quota, (*delaydv1.NamespacePolicy).GetMaxSubscribers,
		func(p *storage.Policy) *int { return &p.MaxSubscribers }, 1, maxSubscribers,
		fmt.Sprintf("1-%d, or 0 for the server default", maxSubscribers)),
	policyDurationField("max_delay", quota, (*delaydv1.NamespacePolicy).GetMaxDelay,
		func(p *storage.Policy) *time.Duration { return &p.MaxDelay }, minMaxDelay, maxMaxDelay, "1s-3660 days"),
	// Not a quota: a namespace's own admin may stop and resume its
	// deliveries (a downstream being fixed).
	boolField("paused", notQuota, (*delaydv1.NamespacePolicy).GetPaused, func(p *storage.Policy) *bool { return &p.Paused }),
	// Not a quota either: it only slows the namespace's own deliveries.
	floatField("max_dispatch_rate", notQuota, (*delaydv1.NamespacePolicy).GetMaxDispatchRate,
		func(p *storage.Policy) *float64 { return &p.MaxDispatchRate }, 0, maxDispatchRate,
		fmt.Sprintf("0-%d deliveries per second (0 = unlimited)", maxDispatchRate)),
	// A quota (capacity: Redis slots, fan-out per pop); fixed after create
	// (UpdateNamespace refuses a change). 0 keeps what is set (the default,
	// 1, at create).
	keepZero(intField("shards", quota, (*delaydv1.NamespacePolicy).GetShards,
		func(p *storage.Policy) *int { return &p.Shards }, 1, storage.MaxShards,
		fmt.Sprintf("1-%d, or 0 for the default (1; unchanged in an update)", storage.MaxShards))),
	// Not a quota: the operator's allow list (--push-allow) bounds where a
	// namespace admin may point it (checkPushURL).
	{name: "push", set: setPush, same: func(a, b storage.Policy) bool { return a.Push == b.Push }},
	// A quota: the events are kept in the stores (Redis or MySQL).
	intField("history_retention_bytes", quota, (*delaydv1.NamespacePolicy).GetHistoryRetentionBytes,
		func(p *storage.Policy) *int64 { return &p.HistoryRetentionBytes }, storage.MinHistoryRetentionBytes, storage.MaxHistoryRetentionBytes,
		fmt.Sprintf("%d-%d bytes (64 KiB-1 GiB), or 0 for no history", storage.MinHistoryRetentionBytes, storage.MaxHistoryRetentionBytes)),
	// A quota: each schedule is a stored definition and the firings of
	// its next lookahead.
	intField("max_schedules", quota, (*delaydv1.NamespacePolicy).GetMaxSchedules,
		func(p *storage.Policy) *int { return &p.MaxSchedules }, 1, maxSchedules,
		fmt.Sprintf("1-%d, or 0 for the server default", maxSchedules)),
}

// policyDurationField is a policy duration: unset or zero = 0 (the server
// default), otherwise within [lo, hi] (allowed says so to the client),
// truncated to whole milliseconds.
func policyDurationField(name string, quota bool, wire func(*delaydv1.NamespacePolicy) *durationpb.Duration,
	field func(*storage.Policy) *time.Duration, lo, hi time.Duration, allowed string) policyField {
	return policyField{
		name: name, quota: quota, same: sameField(field),
		set: func(dst *storage.Policy, src *delaydv1.NamespacePolicy, f string) (err error) {
			*field(dst), err = policyDuration(f, wire(src), lo, hi, allowed)
			return err
		},
	}
}

// intField is a policy integer: 0 (the server default, or what allowed
// says 0 means), or within [lo, hi]. The wire and the domain types may
// differ in width; hi fits both.
func intField[W ~int32 | ~int64, D ~int | ~int32 | ~int64](name string, quota bool, wire func(*delaydv1.NamespacePolicy) W,
	field func(*storage.Policy) *D, lo, hi W, allowed string) policyField {
	return policyField{
		name: name, quota: quota, same: sameField(field),
		set: func(dst *storage.Policy, src *delaydv1.NamespacePolicy, f string) error {
			n := wire(src)
			if n != 0 && (n < lo || n > hi) {
				return rpcerr.Invalidf(f, "is %d; allowed: %s", n, allowed)
			}
			*field(dst) = D(n)
			return nil
		},
	}
}

// floatField is a policy number: 0 (the server default, or what allowed
// says 0 means), or within [lo, hi]; NaN is refused.
func floatField(name string, quota bool, wire func(*delaydv1.NamespacePolicy) float64,
	field func(*storage.Policy) *float64, lo, hi float64, allowed string) policyField {
	return policyField{
		name: name, quota: quota, same: sameField(field),
		set: func(dst *storage.Policy, src *delaydv1.NamespacePolicy, f string) error {
			r := wire(src)
			if r != 0 && !(r >= lo && r <= hi) { // NaN fails too
				return rpcerr.Invalidf(f, "is %g; allowed: %s", r, allowed)
			}
			*field(dst) = r
			return nil
		},
	}
}

// boolField is a policy switch; every value is valid.
func boolField(name string, quota bool, wire func(*delaydv1.NamespacePolicy) bool, field func(*storage.Policy) *bool) policyField {
	return policyField{
		name: name, quota: quota, same: sameField(field),
		set: func(dst *storage.Policy, src *delaydv1.NamespacePolicy, _ string) error {
			*field(dst) = wire(src)
			return nil
		},
	}
}

// keepZero makes a field's 0 keep the value already in the destination
// instead of setting 0 (shards: fixed once created).
func keepZero(f policyField) policyField {
	set := f.set
	f.set = func(dst *storage.Policy, src *delaydv1.NamespacePolicy, field string) error {
		kept := *dst
		if err := set(dst, src, field); err != nil {
			return err
		}
		if f.same(*dst, storage.Policy{}) {
			*dst = kept
		}
		return nil
	}
	return f
}

// sameField compares one field of two effective policies.
func sameField[T comparable](field func(*storage.Policy) *T) func(a, b storage.Policy) bool {
	return func(a, b storage.Policy) bool { return *field(&a) == *field(&b) }
}

// setPush reads the push target. An empty url turns push off; an absent
// secret keeps the stored one.
func setPush(dst *storage.Policy, src *delaydv1.NamespacePolicy, f string) error {
	p := src.GetPush()
	if p.GetUrl() == "" {
		if p.GetSecret() != "" {
			return rpcerr.Invalidf(f+".url", "is empty while a secret is given; allowed: the URL to push to, or no push at all (no url, no secret) to turn push off")
		}
		dst.Push = storage.PushTarget{}
		return nil
	}
	if n := len(p.GetUrl()); n > maxPushURLBytes {
		return rpcerr.Invalidf(f+".url", "is %d bytes; allowed: at most %d", n, maxPushURLBytes)
	}
	if n := len(p.GetSecret()); n > 0 && (n < minPushSecretBytes || n > maxPushSecretBytes) {
		return rpcerr.Invalidf(f+".secret", "is %d bytes; allowed: %d-%d bytes (a random string of at least 32 characters is best)", n, minPushSecretBytes, maxPushSecretBytes)
	}
	dst.Push.URL = p.GetUrl()
	if p.GetSecret() != "" {
		dst.Push.Secret = p.GetSecret()
	}
	return nil
}

// policyDuration reads a policy duration: unset or zero = 0 (the server
// default), otherwise within [min, max], truncated to whole milliseconds.
func policyDuration(field string, d *durationpb.Duration, lo, hi time.Duration, allowed string) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, rpcerr.Invalidf(field, "is not a valid duration; allowed: %s, or 0 for the server default", allowed)
	}
	v := d.AsDuration().Truncate(time.Millisecond)
	if v == 0 && d.GetSeconds() == 0 && d.GetNanos() == 0 {
		return 0, nil
	}
	if v < lo || v > hi {
		return 0, rpcerr.Invalidf(field, "is %s; allowed: %s, or 0 for the server default", d.AsDuration(), allowed)
	}
	return v, nil
}

// policyFromProto reads every field of p (nil = all defaults).
func policyFromProto(prefix string, p *delaydv1.NamespacePolicy) (storage.Policy, error) {
	var out storage.Policy
	for _, f := range policyFields {
		if err := f.set(&out, p, prefix+f.name); err != nil {
			return storage.Policy{}, err
		}
	}
	return out, nil
}

// policyToProto is the wire form of an effective policy.
func policyToProto(p storage.Policy) *delaydv1.NamespacePolicy {
	return &delaydv1.NamespacePolicy{
		AckTimeout:            durationpb.New(p.AckTimeout),
		MaxAttempts:           p.MaxAttempts,
		BackoffInitial:        durationpb.New(p.Backoff.Initial),
		BackoffMax:            durationpb.New(p.Backoff.Max),
		BackoffMultiplier:     p.Backoff.Multiplier,
		MaxPayloadBytes:       int32(min(p.MaxPayloadBytes, math.MaxInt32)),
		MaxPendingTasks:       p.MaxPendingTasks,
		RateLimit:             p.RateLimit,
		RateBurst:             int32(min(p.RateBurst, math.MaxInt32)),
		MaxSubscribers:        int32(min(p.MaxSubscribers, math.MaxInt32)),
		MaxDelay:              durationpb.New(p.MaxDelay),
		Paused:                p.Paused,
		MaxDispatchRate:       p.MaxDispatchRate,
		Shards:                int32(min(max(p.Shards, 1), storage.MaxShards)),
		Push:                  pushToProto(p.Push),
		HistoryRetentionBytes: p.HistoryRetentionBytes,
		MaxSchedules:          int32(min(p.MaxSchedules, math.MaxInt32)),
	}
}

// pushToProto is the wire form of a push target: never the secret, only
// whether one is stored.
func pushToProto(t storage.PushTarget) *delaydv1.PushTarget {
	if !t.Enabled() {
		return nil
	}
	return &delaydv1.PushTarget{Url: t.URL, SecretSet: t.Secret != ""}
}
