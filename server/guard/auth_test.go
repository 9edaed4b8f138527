package guard

import (
	"context"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// TestEveryMethodHasARule: authorization is default-deny, so every RPC the
// server registers needs an entry in rules — and rules names no RPC that
// does not exist.
func TestEveryMethodHasARule(t *testing.T) {
	registered := map[string]bool{}
	for _, sd := range []grpc.ServiceDesc{delaydv1.TaskService_ServiceDesc, delaydv1.DeliveryService_ServiceDesc, delaydv1.NamespaceService_ServiceDesc,
		delaydv1.ScheduleService_ServiceDesc} {
		for _, m := range sd.Methods {
			registered["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
		for _, s := range sd.Streams {
			registered["/"+sd.ServiceName+"/"+s.StreamName] = true
		}
	}
	for m := range registered {
		if _, ok := rules[m]; !ok {
			t.Errorf("%s has no authorization rule", m)
		}
	}
	for m := range rules {
		if !registered[m] {
			t.Errorf("rule for %s, which is not an RPC", m)
		}
	}
	// The scope of each service's RPCs.
	for m, r := range rules {
		var want storage.Scope
		switch {
		case strings.HasPrefix(m, "/delayd.v1.TaskService/"):
			want = storage.ScopeProduce
		case strings.HasPrefix(m, "/delayd.v1.DeliveryService/"):
			want = storage.ScopeConsume
		case strings.HasPrefix(m, "/delayd.v1.ScheduleService/"):
			// A namespace's producers manage its schedules; its admins too.
			want = storage.ScopeProduce
			if r.orScope != storage.ScopeAdmin {
				t.Errorf("%s: a namespace admin may not manage schedules", m)
			}
		default:
			want = storage.ScopeAdmin
		}
		if r.anyKey {
			if m != "/delayd.v1.NamespaceService/WhoAmI" {
				t.Errorf("%s may be called by any key; only WhoAmI may", m)
			}
			continue
		}
		if r.scope != want {
			t.Errorf("%s needs %s, want %s", m, r.scope, want)
		}
	}
}

// TestUnknownMethodIsRefused: a method without a rule is refused even for
// a global admin.
func TestUnknownMethodIsRefused(t *testing.T) {
	z := &authorizer{}
	ctx := context.WithValue(context.Background(), principalKey{}, &Principal{
		KeyID: "admin-key", Namespace: storage.GlobalNamespace,
		Scopes: []storage.Scope{storage.ScopeProduce, storage.ScopeConsume, storage.ScopeAdmin},
	})
	if err := z.authorize(ctx, "/delayd.v1.TaskService/DropEverything", nil); status.Code(err) != codes.PermissionDenied {
		t.Errorf("unknown method: %v, want PermissionDenied", err)
	}
	if err := z.authorize(context.Background(), delaydv1.TaskService_GetTask_FullMethodName, &delaydv1.GetTaskRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no principal: %v, want Unauthenticated", err)
	}
}

func TestPrincipalAllows(t *testing.T) {
	ns := &Principal{KeyID: "k", Namespace: "orders", Scopes: []storage.Scope{storage.ScopeProduce}}
	global := &Principal{KeyID: "g", Namespace: storage.GlobalNamespace, Scopes: []storage.Scope{storage.ScopeConsume}}
	for _, tc := range []struct {
		p     *Principal
		scope storage.Scope
		ns    string
		want  bool
	}{
		{ns, storage.ScopeProduce, "orders", true},
		{ns, storage.ScopeProduce, "orders2", false},
		{ns, storage.ScopeProduce, "order", false},
		{ns, storage.ScopeProduce, "", false},
		{ns, storage.ScopeProduce, "*", false},
		{ns, storage.ScopeConsume, "orders", false},
		{global, storage.ScopeConsume, "orders", true},
		{global, storage.ScopeConsume, "*", true},
		{global, storage.ScopeProduce, "orders", false},
	} {
		if got := tc.p.Allows(tc.scope, tc.ns); got != tc.want {
			t.Errorf("key of %q with %v: allows(%s, %q) = %v, want %v", tc.p.Namespace, tc.p.Scopes, tc.scope, tc.ns, got, tc.want)
		}
	}
}

func TestAPIKeyFormat(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id, secret, err := NewAPIKey()
		if err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("id %s drawn twice", id)
		}
		seen[id] = true
		got, ok := parseAPIKey(secret)
		if !ok || got != id || !validKeyID(id) {
			t.Fatalf("parseAPIKey(%q) = %q, %v; want %q", secret, got, ok, id)
		}
	}
	_, secret, _ := NewAPIKey()
	for _, bad := range []string{
		"", "dk_", secret[:len(secret)-1], secret + "x",
		"xk" + secret[2:],
		strings.Replace(secret, "_", "-", 2),
		secret[:3] + "ABCDEF0123456789" + secret[19:], // id not lower-case hex
		secret[:len(secret)-1] + "=",                  // not base64url
	} {
		if _, ok := parseAPIKey(bad); ok {
			t.Errorf("parseAPIKey(%q) accepted", bad)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   string // "" = refused
	}{
		{[]string{"Bearer abc"}, "abc"},
		{[]string{"bearer abc"}, "abc"},
		{[]string{"BEARER   abc  "}, "abc"},
		{[]string{"  Bearer abc"}, "abc"},
		{nil, ""},
		{[]string{""}, ""},
		{[]string{"Bearer"}, ""},
		{[]string{"Bearer "}, ""},
		{[]string{"Basic abc"}, ""},
		{[]string{"abc"}, ""},
		{[]string{"Bearer a b"}, ""},
		{[]string{"Bearer a\x00b"}, ""},
		{[]string{"Bearer abcé"}, ""},
		{[]string{"Bearer a", "Bearer b"}, ""},
		{[]string{"Bearer " + strings.Repeat("a", maxBearerLength+1)}, ""},
	} {
		got, err := bearerToken(tc.values)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", tc.values, got, err, tc.want)
		}
		if err != nil && status.Code(err) != codes.Unauthenticated {
			t.Errorf("bearerToken(%q): %v, want Unauthenticated", tc.values, err)
		}
	}
}

func TestResolveAuth(t *testing.T) {
	good := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name              string
		key               string
		noAuth, embedded  bool
		wantDisabled, err bool
		say               string
	}{
		{name: "admin key", key: good},
		{name: "admin key embedded", key: good, embedded: true},
		{name: "no-auth", noAuth: true, wantDisabled: true},
		{name: "embedded default", embedded: true, wantDisabled: true},
		{name: "real redis, nothing set", err: true, say: "--admin-key"},
		{name: "both", key: good, noAuth: true, err: true, say: "drop one"},
		{name: "short key", key: "short", err: true, say: "32-512"},
		{name: "31 characters", key: good[:31], err: true, say: "openssl rand -base64 32"},
		{name: "key with space", key: "0123456789 abcdef0123456789abcdef", err: true, say: "space"},
		// deploy/systemd/delayd.env.example's placeholder, and others like it.
		{name: "the example's placeholder", key: systemdExampleKey(t), err: true, say: "placeholder"},
		{name: "CHANGE-ME", key: "CHANGE-ME-TO-A-LONG-RANDOM-KEY-0123456789", err: true, say: `placeholder (it says "changeme")`},
		{name: "change_me lower case", key: "please_change_me_0123456789abcdef", err: true, say: "openssl rand -base64 32"},
		{name: "replace me", key: "ReplaceMe.0123456789abcdef.0123456789", err: true, say: "placeholder"},
	} {
		a, err := ResolveAuth(tc.key, tc.noAuth, tc.embedded)
		if (err != nil) != tc.err || (err != nil && !strings.Contains(err.Error(), tc.say)) {
			t.Errorf("%s: err = %v, want error %v mentioning %q", tc.name, err, tc.err, tc.say)
			continue
		}
		if err == nil && (a.Disabled != tc.wantDisabled || (!a.Disabled && a.AdminKey != tc.key)) {
			t.Errorf("%s: %+v", tc.name, a)
		}
	}
}

// FuzzAuthMetadata fuzzes the parsing of authorization metadata and of the
// API key inside it: nothing panics; an accepted token is 1-1024 printable
// ASCII characters without spaces and round-trips; an accepted API key has
// the documented shape; the authenticator answers every input with a
// principal or Unauthenticated, never anything else.
func FuzzAuthMetadata(f *testing.F) {
	_, secret, _ := NewAPIKey()
	for _, s := range []string{
		"Bearer " + secret, "bearer " + secret, "Bearer", "Basic x", "", " ", "Bearer \x00",
		"Bearer dk_0123456789abcdef_", "Bearer " + strings.Repeat("x", 2000), "Bearer dk__",
		"Bearer  " + secret + " ", "Bearer\t" + secret,
	} {
		f.Add(s, false)
	}
	f.Add("Bearer "+secret, true)
	a := &authenticator{
		adminHash: HashSecret("fuzz-admin-key-0123456789abcdef0123456789"),
		keys: func(_ context.Context, id string) (storage.Key, error) {
			if id == "0123456789abcdef" {
				return storage.Key{ID: id, Namespace: "ns", Scopes: []storage.Scope{storage.ScopeProduce}, Hash: HashSecret("never matches")}, nil
			}
			return storage.Key{}, storage.ErrNotFound
		},
	}
	f.Fuzz(func(t *testing.T, value string, twice bool) {
		values := []string{value}
		if twice {
			values = append(values, value)
		}
		token, err := bearerToken(values)
		if err != nil {
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("bearerToken(%q): %v, want Unauthenticated", values, err)
			}
		} else {
			if twice {
				t.Fatalf("two authorization values accepted: %q", values)
			}
			if token == "" || len(token) > maxBearerLength {
				t.Fatalf("token %q of length %d accepted", token, len(token))
			}
			for i := 0; i < len(token); i++ {
				if c := token[i]; c <= ' ' || c > '~' {
					t.Fatalf("token %q has byte %#x", token, c)
				}
			}
			if again, err := bearerToken([]string{"Bearer " + token}); err != nil || again != token {
				t.Fatalf("token %q does not round-trip: %q, %v", token, again, err)
			}
			if id, ok := parseAPIKey(token); ok {
				if !validKeyID(id) || !strings.HasPrefix(token, apiKeyPrefix+id+"_") || len(token) != apiKeyLen {
					t.Fatalf("parseAPIKey(%q) accepted id %q", token, id)
				}
			}
		}
		md := metadata.MD{}
		for _, v := range values {
			md.Append("authorization", v)
		}
		ctx, err := a.authenticate(metadata.NewIncomingContext(context.Background(), md))
		if err != nil {
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("authenticate(%q): %v, want Unauthenticated", values, err)
			}
			return
		}
		p := PrincipalFrom(ctx)
		if p == nil || p.KeyID != "admin-key" {
			t.Fatalf("authenticate(%q) let in %+v; only the admin key can match here", values, p)
		}
	})
}

// systemdExampleKey is DELAYD_ADMIN_KEY's value in
// deploy/systemd/delayd.env.example: delayd must refuse to start with it.
func systemdExampleKey(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/systemd/delayd.env.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "DELAYD_ADMIN_KEY="); ok {
			return v
		}
	}
	t.Fatal("delayd.env.example sets no DELAYD_ADMIN_KEY")
	return ""
}
