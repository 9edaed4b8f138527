package server

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// TestPolicyFromProtoRefuses pins what the policy table says about each
// field's bad values: the field named, the value, what is allowed.
func TestPolicyFromProtoRefuses(t *testing.T) {
	dur := durationpb.New
	tests := []struct {
		p    *delaydv1.NamespacePolicy
		want string
	}{
		{&delaydv1.NamespacePolicy{AckTimeout: dur(500 * time.Millisecond)}, "p.ack_timeout is 500ms; allowed: 1s-12h, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{AckTimeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "p.ack_timeout is not a valid duration; allowed: 1s-12h, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxAttempts: -1}, "p.max_attempts is -1; allowed: 1-1000, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxAttempts: 1001}, "p.max_attempts is 1001; allowed: 1-1000, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{BackoffInitial: dur(25 * time.Hour)}, "p.backoff_initial is 25h0m0s; allowed: 1ms-24h, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{BackoffMax: dur(time.Microsecond)}, "p.backoff_max is 1µs; allowed: 1ms-24h, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{BackoffMultiplier: 0.5}, "p.backoff_multiplier is 0.5; allowed: 1-10, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{BackoffMultiplier: math.NaN()}, "p.backoff_multiplier is NaN; allowed: 1-10, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxPayloadBytes: 4<<20 + 1}, "p.max_payload_bytes is 4194305; allowed: 1-4194304 (4 MiB), or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxPendingTasks: -5}, "p.max_pending_tasks is -5; allowed: 1-1000000000000, or 0 for unlimited"},
		{&delaydv1.NamespacePolicy{RateLimit: -1}, "p.rate_limit is -1; allowed: 0-1000000 requests per second (0 = unlimited)"},
		{&delaydv1.NamespacePolicy{RateLimit: math.Inf(1)}, "p.rate_limit is +Inf; allowed: 0-1000000 requests per second (0 = unlimited)"},
		{&delaydv1.NamespacePolicy{RateBurst: 1_000_001}, "p.rate_burst is 1000001; allowed: 1-1000000, or 0 for rate_limit rounded up"},
		{&delaydv1.NamespacePolicy{MaxSubscribers: -2}, "p.max_subscribers is -2; allowed: 1-100000, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxDelay: dur(time.Millisecond)}, "p.max_delay is 1ms; allowed: 1s-3660 days, or 0 for the server default"},
		{&delaydv1.NamespacePolicy{MaxDispatchRate: math.NaN()}, "p.max_dispatch_rate is NaN; allowed: 0-1000000 deliveries per second (0 = unlimited)"},
		{&delaydv1.NamespacePolicy{Shards: 257}, "p.shards is 257; allowed: 1-256, or 0 for the default (1; unchanged in an update)"},
		{&delaydv1.NamespacePolicy{Shards: -1}, "p.shards is -1; allowed: 1-256, or 0 for the default (1; unchanged in an update)"},
		{&delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Secret: "0123456789abcdef"}}, "p.push.url is empty while a secret is given; allowed: the URL to push to, or no push at all (no url, no secret) to turn push off"},
		{&delaydv1.NamespacePolicy{Push: &delaydv1.PushTarget{Url: "https://x", Secret: "short"}}, "p.push.secret is 5 bytes; allowed: 16-1024 bytes (a random string of at least 32 characters is best)"},
		{&delaydv1.NamespacePolicy{HistoryRetentionBytes: 1}, "p.history_retention_bytes is 1; allowed: 65536-1073741824 bytes (64 KiB-1 GiB), or 0 for no history"},
		{&delaydv1.NamespacePolicy{MaxSchedules: 100001}, "p.max_schedules is 100001; allowed: 1-100000, or 0 for the server default"},
	}
	for _, tc := range tests {
		_, err := policyFromProto("p.", tc.p)
		if err == nil || err.Error() != tc.want {
			t.Errorf("policyFromProto(%v) = %v,\nwant %q", tc.p, err, tc.want)
		}
	}
}

// TestPolicyFromProtoReads: every field's value reaches its place in the
// domain policy (durations truncated to milliseconds), and the table's
// comparison sees each field on its own.
func TestPolicyFromProtoReads(t *testing.T) {
	dur := durationpb.New
	got, err := policyFromProto("p.", &delaydv1.NamespacePolicy{
		AckTimeout: dur(2*time.Second + time.Microsecond), MaxAttempts: 7,
		BackoffInitial: dur(5 * time.Millisecond), BackoffMax: dur(time.Minute), BackoffMultiplier: 1.5,
		MaxPayloadBytes: 1000, MaxPendingTasks: 50, RateLimit: 2.5, RateBurst: 4, MaxSubscribers: 3,
		MaxDelay: dur(time.Hour), Paused: true, MaxDispatchRate: 9.5, Shards: 6,
		Push:                  &delaydv1.PushTarget{Url: "https://x", Secret: "0123456789abcdef"},
		HistoryRetentionBytes: 1 << 20, MaxSchedules: 12,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := storage.Policy{AckTimeout: 2 * time.Second, MaxAttempts: 7,
		Backoff:         storage.Backoff{Initial: 5 * time.Millisecond, Max: time.Minute, Multiplier: 1.5},
		MaxPayloadBytes: 1000, MaxPendingTasks: 50, RateLimit: 2.5, RateBurst: 4, MaxSubscribers: 3,
		MaxDelay: time.Hour, Paused: true, MaxDispatchRate: 9.5, Shards: 6,
		Push:                  storage.PushTarget{URL: "https://x", Secret: "0123456789abcdef"},
		HistoryRetentionBytes: 1 << 20, MaxSchedules: 12}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policyFromProto (-want +got):\n%s", diff)
	}
	for _, f := range policyFields {
		if f.same(got, storage.Policy{}) {
			t.Errorf("field %s: same() sees no difference between a set and a zero policy", f.name)
		}
		one := storage.Policy{}
		if err := f.set(&one, &delaydv1.NamespacePolicy{}, "p."+f.name); err != nil {
			t.Errorf("field %s: a zero value is refused: %v", f.name, err)
		}
	}
	// shards 0 keeps what is set (an update that leaves it unset).
	kept := storage.Policy{Shards: 6}
	for _, f := range policyFields {
		if f.name == "shards" {
			if err := f.set(&kept, &delaydv1.NamespacePolicy{}, "shards"); err != nil || kept.Shards != 6 {
				t.Errorf("shards 0 on a policy of 6 shards: %d, %v; want 6 kept", kept.Shards, err)
			}
		}
	}
}
