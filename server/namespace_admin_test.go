package server_test

import (
	"context"
	"crypto/sha256"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// defaultPolicyProto is the effective default policy as the API shows it.
func defaultPolicyProto() *delaydv1.NamespacePolicy {
	d := storage.DefaultPolicy()
	return &delaydv1.NamespacePolicy{
		AckTimeout:        durationpb.New(d.AckTimeout),
		MaxAttempts:       d.MaxAttempts,
		BackoffInitial:    durationpb.New(d.Backoff.Initial),
		BackoffMax:        durationpb.New(d.Backoff.Max),
		BackoffMultiplier: d.Backoff.Multiplier,
		MaxPayloadBytes:   int32(d.MaxPayloadBytes),
		MaxSubscribers:    int32(d.MaxSubscribers),
		MaxDelay:          durationpb.New(d.MaxDelay),
		Shards:            1,
		MaxSchedules:      int32(d.MaxSchedules),
	}
}

// TestNamespaceShards: shards is set at create (1 by default, at most 256)
// and an update that would change it is refused with FailedPrecondition
// naming the field; an update that leaves it (0, or the same count) works.
func TestNamespaceShards(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	name := "shards-" + testkit.Suffix()
	t.Cleanup(func() { e.drop(name) })
	for _, bad := range []int32{-1, 257} {
		_, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{
			Name: name, Policy: &delaydv1.NamespacePolicy{Shards: bad}}})
		wantCode(t, err, codes.InvalidArgument, "namespace.policy.shards")
	}
	created, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{
		Name: name, Policy: &delaydv1.NamespacePolicy{Shards: 6}}})
	if err != nil || created.GetNamespace().GetPolicy().GetShards() != 6 {
		t.Fatalf("CreateNamespace(shards 6) = %v, %v", created.GetNamespace().GetPolicy(), err)
	}
	for _, paths := range [][]string{{"policy.shards"}, {"policy"}} {
		_, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
			Namespace:  &delaydv1.Namespace{Name: name, Policy: &delaydv1.NamespacePolicy{Shards: 3}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
		})
		wantCode(t, err, codes.FailedPrecondition, "namespace.policy.shards")
	}
	// The whole policy with shards unset (0) keeps the count; so does the same count.
	for _, n := range []int32{0, 6} {
		upd, err := r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
			Namespace:  &delaydv1.Namespace{Name: name, Policy: &delaydv1.NamespacePolicy{Shards: n, MaxAttempts: 4}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}}})
		if err != nil || upd.GetNamespace().GetPolicy().GetShards() != 6 || upd.GetNamespace().GetPolicy().GetMaxAttempts() != 4 {
			t.Fatalf("UpdateNamespace(shards %d) = %v, %v; want shards kept at 6", n, upd.GetNamespace().GetPolicy(), err)
		}
	}
	defaulted := "shards-d-" + testkit.Suffix()
	t.Cleanup(func() { e.drop(defaulted) })
	c, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: defaulted}})
	if err != nil || c.GetNamespace().GetPolicy().GetShards() != 1 {
		t.Fatalf("CreateNamespace(default) shards = %v, %v; want 1", c.GetNamespace().GetPolicy().GetShards(), err)
	}
}

// TestNamespaceLifecycle: create (defaults filled in), get, list, update
// with a mask, delete (refused while tasks remain, forced deletes them).
func TestNamespaceLifecycle(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	name := "life-" + testkit.Suffix()
	t.Cleanup(func() { e.drop(name) })

	created, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{
		Name: name, Policy: &delaydv1.NamespacePolicy{MaxAttempts: 3, RateLimit: 50},
	}})
	if err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
	want := defaultPolicyProto()
	want.MaxAttempts, want.RateLimit, want.RateBurst = 3, 50, 50
	if diff := cmp.Diff(want, created.GetNamespace().GetPolicy(), protocmp.Transform()); diff != "" {
		t.Errorf("created policy (-want +got):\n%s", diff)
	}
	if created.GetNamespace().GetCreateTime() == nil {
		t.Error("create_time not set")
	}
	if _, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: name}}); codeOf(err) != codes.AlreadyExists {
		t.Errorf("second CreateNamespace: %v, want AlreadyExists", err)
	}
	got, err := r.admin.GetNamespace(admin(), &delaydv1.GetNamespaceRequest{Namespace: name})
	if err != nil || !cmp.Equal(created.GetNamespace(), got.GetNamespace(), protocmp.Transform()) {
		t.Errorf("GetNamespace = %v, %v; want %v", got, err, created)
	}
	if _, err := r.admin.GetNamespace(admin(), &delaydv1.GetNamespaceRequest{Namespace: "missing-" + testkit.Suffix()}); codeOf(err) != codes.NotFound {
		t.Errorf("GetNamespace(missing): %v, want NotFound", err)
	}

	// Update one field; the others keep their values.
	upd, err := r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: name, Policy: &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(5 * time.Second), MaxAttempts: 999}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.ack_timeout"}},
	})
	if err != nil {
		t.Fatalf("UpdateNamespace: %v", err)
	}
	want.AckTimeout = durationpb.New(5 * time.Second)
	if diff := cmp.Diff(want, upd.GetNamespace().GetPolicy(), protocmp.Transform()); diff != "" {
		t.Errorf("updated policy (-want +got):\n%s", diff)
	}
	// No mask, or a mask of no path, is refused naming update_mask and
	// changes nothing: proto3 cannot tell paused=false from paused left
	// out, so "every field" would wipe what the caller did not mention
	// (a pause resetting the rate cap) and "the fields present" would
	// ignore a resume.
	for _, mask := range []*fieldmaskpb.FieldMask{nil, {}} {
		_, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: name, Policy: &delaydv1.NamespacePolicy{Paused: true}}, UpdateMask: mask,
		})
		wantCode(t, err, codes.InvalidArgument, "update_mask is required")
		wantCode(t, err, codes.InvalidArgument, `"policy" replaces every field`)
		wantCode(t, err, codes.InvalidArgument, "policy.max_dispatch_rate")
	}
	if got, err := r.admin.GetNamespace(admin(), &delaydv1.GetNamespaceRequest{Namespace: name}); err != nil ||
		!cmp.Equal(want, got.GetNamespace().GetPolicy(), protocmp.Transform()) {
		t.Errorf("after refused updates the policy is %v, %v; want %v", got.GetNamespace().GetPolicy(), err, want)
	}
	// The mask "policy" replaces every field: zero = back to the defaults.
	upd, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: name}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	})
	if err != nil || !cmp.Equal(defaultPolicyProto(), upd.GetNamespace().GetPolicy(), protocmp.Transform()) {
		t.Errorf("UpdateNamespace(mask policy) = %v, %v; want the defaults", upd.GetNamespace().GetPolicy(), err)
	}

	// The namespace has a task: delete is refused unless forced.
	if err := upsertAs(admin(), r, name, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := upsertAs(admin(), r, name, "t2"); err != nil {
		t.Fatal(err)
	}
	_, err = r.admin.DeleteNamespace(admin(), &delaydv1.DeleteNamespaceRequest{Namespace: name})
	wantCode(t, err, codes.FailedPrecondition, "force")
	del, err := r.admin.DeleteNamespace(admin(), &delaydv1.DeleteNamespaceRequest{Namespace: name, Force: true})
	if err != nil || del.GetDeletedTasks() != 2 {
		t.Fatalf("DeleteNamespace(force) = %v, %v; want 2 tasks deleted", del, err)
	}
	if _, err := r.admin.GetNamespace(admin(), &delaydv1.GetNamespaceRequest{Namespace: name}); codeOf(err) != codes.NotFound {
		t.Errorf("GetNamespace after delete: %v, want NotFound", err)
	}
	if st, err := e.store.Stats(context.Background(), name); err != nil || st.Scheduled+st.Delivered+st.Dead != 0 {
		t.Errorf("tasks left after a forced delete: %+v %v", st, err)
	}
	// Tasks may only go into an existing namespace (auto-create is off).
	err = upsertAs(admin(), r, name, "t3")
	wantCode(t, err, codes.NotFound, name)
	// An empty namespace is deleted without force.
	empty := e.newNamespace(r, "empty-", nil)
	if _, err := r.admin.DeleteNamespace(admin(), &delaydv1.DeleteNamespaceRequest{Namespace: empty}); err != nil {
		t.Errorf("DeleteNamespace(empty): %v", err)
	}
}

// TestListNamespacesPages pages through namespaces in name order.
func TestListNamespacesPages(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	var mine []string
	for range 5 {
		mine = append(mine, e.newNamespace(r, "lst-", nil))
	}
	seen := map[string]bool{}
	var last string
	token := ""
	for pages := 0; pages < 10000; pages++ {
		resp, err := r.admin.ListNamespaces(admin(), &delaydv1.ListNamespacesRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatalf("ListNamespaces: %v", err)
		}
		if len(resp.GetNamespaces()) > 2 {
			t.Fatalf("page of %d, asked for 2", len(resp.GetNamespaces()))
		}
		for _, n := range resp.GetNamespaces() {
			if n.GetName() <= last {
				t.Fatalf("%q listed after %q: not in name order", n.GetName(), last)
			}
			last = n.GetName()
			seen[n.GetName()] = true
		}
		token = resp.GetNextPageToken()
		if token == "" {
			break
		}
	}
	for _, n := range mine {
		if !seen[n] {
			t.Errorf("%s not listed", n)
		}
	}
	_, err := r.admin.ListNamespaces(admin(), &delaydv1.ListNamespacesRequest{PageToken: "garbage"})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	_, err = r.admin.ListNamespaces(admin(), &delaydv1.ListNamespacesRequest{PageSize: 1001})
	wantCode(t, err, codes.InvalidArgument, "page_size")
}

// TestPolicyValidation: every policy field is checked, and the error names
// the field and the allowed range.
func TestPolicyValidation(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	for _, tc := range []struct {
		field string
		pol   *delaydv1.NamespacePolicy
		say   string
	}{
		{"ack_timeout", &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(500 * time.Millisecond)}, "1s-12h"},
		{"ack_timeout", &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(13 * time.Hour)}, "1s-12h"},
		{"max_attempts", &delaydv1.NamespacePolicy{MaxAttempts: 1001}, "1-1000"},
		{"max_attempts", &delaydv1.NamespacePolicy{MaxAttempts: -1}, "1-1000"},
		{"backoff_initial", &delaydv1.NamespacePolicy{BackoffInitial: durationpb.New(-time.Second)}, "1ms-24h"},
		{"backoff_max", &delaydv1.NamespacePolicy{BackoffMax: durationpb.New(25 * time.Hour)}, "1ms-24h"},
		{"backoff_initial", &delaydv1.NamespacePolicy{BackoffInitial: durationpb.New(time.Hour), BackoffMax: durationpb.New(time.Minute)}, "backoff_max"},
		{"backoff_multiplier", &delaydv1.NamespacePolicy{BackoffMultiplier: 0.5}, "1-10"},
		{"backoff_multiplier", &delaydv1.NamespacePolicy{BackoffMultiplier: math.NaN()}, "1-10"},
		{"max_payload_bytes", &delaydv1.NamespacePolicy{MaxPayloadBytes: 5 << 20}, "4194304"},
		{"max_pending_tasks", &delaydv1.NamespacePolicy{MaxPendingTasks: -5}, "unlimited"},
		{"rate_limit", &delaydv1.NamespacePolicy{RateLimit: -1}, "0-1000000"},
		{"rate_limit", &delaydv1.NamespacePolicy{RateLimit: math.Inf(1)}, "0-1000000"},
		{"rate_burst", &delaydv1.NamespacePolicy{RateBurst: -1}, "1-1000000"},
		{"max_subscribers", &delaydv1.NamespacePolicy{MaxSubscribers: 100001}, "1-100000"},
		{"max_delay", &delaydv1.NamespacePolicy{MaxDelay: durationpb.New(time.Millisecond)}, "1s-3660 days"},
		{"max_dispatch_rate", &delaydv1.NamespacePolicy{MaxDispatchRate: -1}, "0-1000000 deliveries per second"},
		{"max_dispatch_rate", &delaydv1.NamespacePolicy{MaxDispatchRate: math.NaN()}, "0-1000000 deliveries per second"},
	} {
		name := "val-" + testkit.Suffix()
		_, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: name, Policy: tc.pol}})
		wantCode(t, err, codes.InvalidArgument, "namespace.policy."+tc.field)
		wantCode(t, err, codes.InvalidArgument, tc.say)
		if _, err := e.store.GetNamespace(context.Background(), name); err == nil {
			e.drop(name)
			t.Errorf("%s: an invalid namespace was stored", tc.field)
		}
	}
	_, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: "Bad Name"}})
	wantCode(t, err, codes.InvalidArgument, "namespace.name")
	_, err = r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{})
	wantCode(t, err, codes.InvalidArgument, "namespace")

	ns := e.newNamespace(r, "val-", nil)
	_, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: ns},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.nonsense"}},
	})
	wantCode(t, err, codes.InvalidArgument, "update_mask.paths[0]")
	_, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{MaxAttempts: 5000}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.max_attempts"}},
	})
	wantCode(t, err, codes.InvalidArgument, "namespace.policy.max_attempts is 5000; allowed: 1-1000")
	// An update whose result contradicts itself is refused, nothing written.
	_, err = r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{BackoffInitial: durationpb.New(time.Hour)}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.backoff_initial"}},
	})
	wantCode(t, err, codes.InvalidArgument, "backoff_max")
	if n, _ := e.store.GetNamespace(context.Background(), ns); n.Policy.Backoff.Initial != 0 {
		t.Errorf("a refused update was written: %+v", n.Policy)
	}
}

// TestUpdateMaskPathSpellings: a policy path in update_mask may be written
// as the proto names it (policy.max_dispatch_rate) or as JSON does
// (policy.maxDispatchRate). grpcurl sends a FieldMask's paths as they are
// written, without protojson's lowerCamel-to-snake conversion, so the
// README's UpdateNamespace lines work either way.
func TestUpdateMaskPathSpellings(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "mask-", nil)
	for _, tc := range []struct {
		path string
		pol  *delaydv1.NamespacePolicy
		want func(*delaydv1.NamespacePolicy) bool
	}{
		{"policy.max_dispatch_rate", &delaydv1.NamespacePolicy{MaxDispatchRate: 7}, func(p *delaydv1.NamespacePolicy) bool { return p.GetMaxDispatchRate() == 7 }},
		{"policy.maxDispatchRate", &delaydv1.NamespacePolicy{MaxDispatchRate: 9}, func(p *delaydv1.NamespacePolicy) bool { return p.GetMaxDispatchRate() == 9 }},
		{"policy.maxAttempts", &delaydv1.NamespacePolicy{MaxAttempts: 3}, func(p *delaydv1.NamespacePolicy) bool { return p.GetMaxAttempts() == 3 }},
		{"policy.paused", &delaydv1.NamespacePolicy{Paused: true}, func(p *delaydv1.NamespacePolicy) bool { return p.GetPaused() }},
	} {
		got, err := r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: ns, Policy: tc.pol}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{tc.path}},
		})
		if err != nil {
			t.Errorf("update_mask %q: %v", tc.path, err)
			continue
		}
		if !tc.want(got.GetNamespace().GetPolicy()) {
			t.Errorf("update_mask %q: the policy is now %v", tc.path, got.GetNamespace().GetPolicy())
		}
	}
	// A camel spelling of no field is refused, naming both spellings.
	_, err := r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: ns}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.maxDispatchrate"}},
	})
	wantCode(t, err, codes.InvalidArgument, "update_mask.paths[0]")
	wantCode(t, err, codes.InvalidArgument, "policy.max_dispatch_rate")
	wantCode(t, err, codes.InvalidArgument, "policy.maxDispatchRate")
}

// TestNamespaceAdminCannotRaiseQuotas: a namespace's own admin key may tune
// its retry policy but not its limits; a global admin may.
func TestNamespaceAdminCannotRaiseQuotas(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "quo-", &delaydv1.NamespacePolicy{RateLimit: 10})
	_, nsAdmin := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_ADMIN)
	update := func(ctx context.Context, pol *delaydv1.NamespacePolicy, path string) error {
		_, err := r.admin.UpdateNamespace(ctx, &delaydv1.UpdateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: ns, Policy: pol}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{path}},
		})
		return err
	}
	if err := update(as(nsAdmin), &delaydv1.NamespacePolicy{MaxAttempts: 4}, "policy.max_attempts"); err != nil {
		t.Errorf("namespace admin tuning max_attempts: %v", err)
	}
	// Pausing is not a quota: the namespace's own admin stops and resumes
	// its deliveries, and stats say so.
	if err := update(as(nsAdmin), &delaydv1.NamespacePolicy{Paused: true}, "policy.paused"); err != nil {
		t.Errorf("namespace admin pausing: %v", err)
	}
	if st, err := r.admin.GetNamespaceStats(as(nsAdmin), &delaydv1.GetNamespaceStatsRequest{Namespace: ns}); err != nil || !st.GetPaused() {
		t.Errorf("stats after pause: paused %v, %v; want true", st.GetPaused(), err)
	}
	if n, err := r.admin.GetNamespace(as(nsAdmin), &delaydv1.GetNamespaceRequest{Namespace: ns}); err != nil || !n.GetNamespace().GetPolicy().GetPaused() {
		t.Errorf("GetNamespace after pause: paused %v, %v; want true", n.GetNamespace().GetPolicy().GetPaused(), err)
	}
	if err := update(as(nsAdmin), &delaydv1.NamespacePolicy{}, "policy.paused"); err != nil {
		t.Errorf("namespace admin resuming: %v", err)
	}
	// Capping its own dispatch rate only slows the namespace: not a quota.
	if err := update(as(nsAdmin), &delaydv1.NamespacePolicy{MaxDispatchRate: 5}, "policy.max_dispatch_rate"); err != nil {
		t.Errorf("namespace admin capping its dispatch rate: %v", err)
	}
	err := update(as(nsAdmin), &delaydv1.NamespacePolicy{RateLimit: 1e6}, "policy.rate_limit")
	wantCode(t, err, codes.PermissionDenied, "rate_limit")
	if err := update(admin(), &delaydv1.NamespacePolicy{RateLimit: 1e6}, "policy.rate_limit"); err != nil {
		t.Errorf("global admin raising rate_limit: %v", err)
	}
	// Rewriting the whole policy with unchanged limits is fine for the
	// namespace admin (a read-modify-write of GetNamespace's answer).
	got, err := r.admin.GetNamespace(as(nsAdmin), &delaydv1.GetNamespaceRequest{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	got.GetNamespace().GetPolicy().MaxAttempts = 6
	if _, err := r.admin.UpdateNamespace(as(nsAdmin), &delaydv1.UpdateNamespaceRequest{
		Namespace: got.GetNamespace(), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	}); err != nil {
		t.Errorf("namespace admin writing back its policy with unchanged limits: %v", err)
	}
}

// TestAPIKeys: a key's secret is shown once (dk_<id>_<random>), stored only
// as its SHA-256, listed without it, usable at once, and revoked.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "keys-", nil)
	resp, err := r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{
		Namespace: ns, Description: "orders producer",
		Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME, delaydv1.KeyScope_KEY_SCOPE_PRODUCE},
	})
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	id, secret := resp.GetKey().GetId(), resp.GetSecret()
	if !regexp.MustCompile(`^dk_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$`).MatchString(secret) || !strings.HasPrefix(secret, "dk_"+id+"_") {
		t.Errorf("secret %q, id %q: want dk_<id>_<43 base64url characters>", secret, id)
	}
	wantScopes := []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME}
	if !cmp.Equal(wantScopes, resp.GetKey().GetScopes()) {
		t.Errorf("scopes %v, want %v (deduplicated)", resp.GetKey().GetScopes(), wantScopes)
	}

	// Stored as a hash only.
	stored, err := e.store.GetKey(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(secret))
	if !cmp.Equal(stored.Hash, sum[:]) {
		t.Errorf("stored hash is not SHA-256 of the secret")
	}

	// Listed without the secret.
	list, err := r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns})
	if err != nil || len(list.GetKeys()) != 1 || list.GetKeys()[0].GetId() != id || list.GetKeys()[0].GetDescription() != "orders producer" {
		t.Errorf("ListKeys = %v, %v", list, err)
	}
	if strings.Contains(list.String(), secret[len(secret)-43:]) {
		t.Error("ListKeys shows the secret")
	}

	// Usable at once; revoked at once.
	if err := upsertAs(as(secret), r, ns, "x"); err != nil {
		t.Errorf("UpsertTask with the new key: %v", err)
	}
	if _, err := r.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	if err := upsertAs(as(secret), r, ns, "y"); codeOf(err) != codes.Unauthenticated {
		t.Errorf("UpsertTask with the revoked key: %v, want Unauthenticated", err)
	}
	_, err = r.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: id})
	wantCode(t, err, codes.NotFound, id)

	// Validation.
	for _, tc := range []struct {
		req  *delaydv1.CreateKeyRequest
		code codes.Code
		say  string
	}{
		{&delaydv1.CreateKeyRequest{Namespace: ns}, codes.InvalidArgument, "scopes"},
		{&delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{9}}, codes.InvalidArgument, "scopes[0]"},
		{&delaydv1.CreateKeyRequest{Namespace: "BAD", Scopes: []delaydv1.KeyScope{1}}, codes.InvalidArgument, "namespace"},
		{&delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{1}, Description: strings.Repeat("d", 257)}, codes.InvalidArgument, "description"},
		{&delaydv1.CreateKeyRequest{Namespace: "nope-" + testkit.Suffix(), Scopes: []delaydv1.KeyScope{1}}, codes.NotFound, "nope-"},
	} {
		_, err := r.admin.CreateKey(admin(), tc.req)
		wantCode(t, err, tc.code, tc.say)
	}
	_, err = r.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: "not-an-id"})
	wantCode(t, err, codes.InvalidArgument, "id")
}

// TestRevocationReachesOtherReplicas: a key revoked through one replica
// stops working on another within the registry cache's TTL.
func TestRevocationReachesOtherReplicas(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	ttl := func(c *tenancy.Config) { c.TTL = 200 * time.Millisecond }
	r1 := e.replica(tenOpts{tenancy: ttl})
	r2 := e.replica(tenOpts{tenancy: ttl})
	ns := e.newNamespace(r1, "rev-", nil)
	id, secret := e.newKey(r1, ns, delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	if err := upsertAs(as(secret), r2, ns, "a"); err != nil {
		t.Fatalf("key on the other replica: %v", err)
	}
	if _, err := r1.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(dlvWait)
	for {
		err := upsertAs(as(secret), r2, ns, "a")
		if codeOf(err) == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revoked key still works on the other replica: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAutoCreate: with auto-create on, a task goes into a namespace that
// did not exist, which then exists with the default policy.
func TestAutoCreate(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{
		tenancy: func(c *tenancy.Config) { c.AutoCreate = true },
		server:  func(o *server.Options) { o.Auth = guard.AuthOptions{Disabled: true} },
	})
	ns := "auto-" + testkit.Suffix()
	t.Cleanup(func() { e.drop(ns) })
	if err := upsertAs(context.Background(), r, ns, "a"); err != nil {
		t.Fatalf("UpsertTask into a new namespace with auto-create: %v", err)
	}
	got, err := r.admin.GetNamespace(context.Background(), &delaydv1.GetNamespaceRequest{Namespace: ns})
	if err != nil || !cmp.Equal(defaultPolicyProto(), got.GetNamespace().GetPolicy(), protocmp.Transform()) {
		t.Errorf("auto-created namespace = %v, %v; want the default policy", got, err)
	}
	// Reading does not create.
	other := "auto-" + testkit.Suffix()
	if _, err := r.tasks.GetTask(context.Background(), &delaydv1.GetTaskRequest{Namespace: other, Id: "x"}); codeOf(err) != codes.NotFound {
		t.Errorf("GetTask in an unknown namespace: %v", err)
	}
	if _, err := e.store.GetNamespace(context.Background(), other); err == nil {
		e.drop(other)
		t.Errorf("a read created namespace %s", other)
	}
}

// TestPolicyChangeReachesRunningDispatcher: a new ack timeout set through
// one replica is used by another replica's running dispatcher for its next
// deliveries, without a restart.
func TestPolicyChangeReachesRunningDispatcher(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	ttl := func(c *tenancy.Config) { c.TTL = 200 * time.Millisecond }
	r1 := e.replica(tenOpts{tenancy: ttl})
	r2 := e.replica(tenOpts{tenancy: ttl})
	ns := e.newNamespace(r1, "pol-", &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(time.Hour)})

	ctx, cancel := context.WithCancel(admin())
	defer cancel()
	stream, err := r2.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	lease := func(id string) time.Duration {
		t.Helper()
		if err := upsertAs(admin(), r1, ns, id); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		d := resp.GetDelivery()
		if _, err := r2.dlv.AckTasks(admin(), &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{d.GetToken()}}); err != nil {
			t.Fatal(err)
		}
		return d.GetLeaseDeadline().AsTime().Sub(d.GetTask().GetDueTime().AsTime())
	}
	if l := lease("before"); l < 50*time.Minute {
		t.Fatalf("lease before the change = %s, want about 1h", l)
	}
	if _, err := r1.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(5 * time.Second)}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.ack_timeout"}},
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(dlvWait)
	for i := 0; ; i++ {
		if l := lease("after-" + string(rune('a'+i%26)) + testkit.Suffix()); l <= 10*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the running dispatcher never used the new ack timeout")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
