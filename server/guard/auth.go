package guard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	callmeta "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// AuthOptions configure API-key authentication.
//
// Auth is on unless Disabled. (A Server built with auth off logs a warning;
// the daemon refuses to start that way against a real Redis unless told
// to.) Clients send an API key as gRPC metadata "authorization: Bearer
// <key>". A key is either the bootstrap AdminKey or a key created with
// NamespaceService.CreateKey (looked up through Options.Tenancy). The
// health service and server reflection need no key.
type AuthOptions struct {
	// Disabled turns authentication and authorization off: every caller may
	// do everything (--no-auth; the embedded mode's default). Rate limits,
	// quotas and subscriber limits still apply.
	Disabled bool
	// AdminKey is the bootstrap key (--admin-key / DELAYD_ADMIN_KEY): a
	// global key with every scope, for operators to create namespaces and
	// keys with. Any string of 32-512 printable ASCII characters without
	// spaces that is no placeholder (see ResolveAuth); compared in
	// constant time. Empty: no bootstrap key (keys in
	// the registry still work).
	AdminKey string
}

// Bootstrap admin key bounds, checked by ResolveAuth. 32 characters: the
// key may do everything, and `openssl rand -base64 32` (44 characters) or
// `openssl rand -hex 32` (64) costs nothing more than a short one.
const (
	minAdminKeyLen = 32
	maxAdminKeyLen = 512
)

// makeAdminKey is how an error about the admin key says to make one.
const makeAdminKey = "make one with `openssl rand -base64 32` (or `head -c 32 /dev/urandom | base64`) " +
	"and set DELAYD_ADMIN_KEY to it, or write it to a file named by --admin-key-file (DELAYD_ADMIN_KEY_FILE)"

// adminKeyPlaceholders are words an example's placeholder key holds
// (deploy/systemd/delayd.env.example's); a key that holds one, ignoring
// case and punctuation, was copied from an example, not made.
var adminKeyPlaceholders = []string{"changeme", "replaceme", "yourkey", "adminkeyhere"}

// placeholder reports the placeholder word key holds, if any.
func placeholder(key string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(key) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	for _, w := range adminKeyPlaceholders {
		if strings.Contains(b.String(), w) {
			return w
		}
	}
	return ""
}

// ResolveAuth turns the daemon's auth flags into AuthOptions, or says why
// the server must not start and what to do:
//   - an admin key turns auth on (in every mode); with noAuth too it is a
//     contradiction;
//   - noAuth turns auth off;
//   - neither: auth off in embedded mode (the quick start), and a refusal
//     to start otherwise — a shared Redis must not be open to everyone by
//     accident.
func ResolveAuth(adminKey string, noAuth, embedded bool) (AuthOptions, error) {
	switch {
	case adminKey != "" && noAuth:
		return AuthOptions{}, errors.New("both an admin key (--admin-key / DELAYD_ADMIN_KEY) and --no-auth are set: drop one of them")
	case adminKey != "":
		if n := len(adminKey); n < minAdminKeyLen || n > maxAdminKeyLen {
			return AuthOptions{}, fmt.Errorf("the admin key is %d characters long; it must have %d-%d: %s", n, minAdminKeyLen, maxAdminKeyLen, makeAdminKey)
		}
		for i := 0; i < len(adminKey); i++ {
			if c := adminKey[i]; c <= ' ' || c > '~' {
				return AuthOptions{}, fmt.Errorf("the admin key has a space or non-printable byte at position %d; it must be printable ASCII: %s", i, makeAdminKey)
			}
		}
		if w := placeholder(adminKey); w != "" {
			return AuthOptions{}, fmt.Errorf("the admin key is a placeholder (it says %q), not a secret: %s", w, makeAdminKey)
		}
		return AuthOptions{AdminKey: adminKey}, nil
	case noAuth, embedded:
		return AuthOptions{Disabled: true}, nil
	default:
		return AuthOptions{}, errors.New("refusing to start without authentication against a real Redis: " +
			"set a bootstrap admin key with --admin-key or DELAYD_ADMIN_KEY (e.g. DELAYD_ADMIN_KEY=$(openssl rand -base64 32)), " +
			"or pass --no-auth to let every client do everything")
	}
}

// authEnabled reports whether a Server built from opts authenticates
// requests (see AuthOptions).
func authEnabled(opts Config) bool {
	return !opts.Auth.Disabled
}

// API key format: "dk_" + 16 hex characters of id + "_" + 43 characters of
// base64url (256 random bits). The id is public (it names the key in
// ListKeys and RevokeKey); the whole string is the secret, stored only as its
// SHA-256.
const (
	apiKeyPrefix    = "dk_"
	apiKeyIDBytes   = 8
	apiKeyIDLen     = 2 * apiKeyIDBytes
	apiSecretBytes  = 32
	apiSecretLen    = 43 // base64.RawURLEncoding of 32 bytes
	apiKeyLen       = len(apiKeyPrefix) + apiKeyIDLen + 1 + apiSecretLen
	maxBearerLength = 1024 // longer authorization values are refused unread
)

// NewAPIKey returns a fresh key id and the secret that embeds it.
func NewAPIKey() (id, secret string, err error) {
	var b [apiKeyIDBytes + apiSecretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("new api key: %w", err)
	}
	id = hex.EncodeToString(b[:apiKeyIDBytes])
	secret = apiKeyPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(b[apiKeyIDBytes:])
	return id, secret, nil
}

// parseAPIKey returns the id of a well-formed API key (see NewAPIKey).
func parseAPIKey(key string) (id string, ok bool) {
	if len(key) != apiKeyLen || !strings.HasPrefix(key, apiKeyPrefix) {
		return "", false
	}
	id = key[len(apiKeyPrefix) : len(apiKeyPrefix)+apiKeyIDLen]
	if key[len(apiKeyPrefix)+apiKeyIDLen] != '_' {
		return "", false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	if _, err := base64.RawURLEncoding.DecodeString(key[len(key)-apiSecretLen:]); err != nil {
		return "", false
	}
	return id, true
}

// validKeyID reports whether id has the form NewAPIKey produces.
func validKeyID(id string) bool {
	if len(id) != apiKeyIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// HashSecret is what the registry stores for a key: SHA-256 of the whole
// secret. The secret has 256 random bits, so a fast hash is enough.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// Errors of authentication. They say what to do without saying which part
// of a key was wrong.
var (
	errNoCredentials = status.Error(codes.Unauthenticated,
		`missing API key: send gRPC metadata "authorization: Bearer <api key>"`)
	errBadScheme = status.Error(codes.Unauthenticated,
		`malformed authorization metadata: expected exactly one "authorization: Bearer <api key>"`)
	errBadKey = status.Error(codes.Unauthenticated, "invalid API key: unknown, revoked or malformed")
	// ErrKeyFlood: too many unknown key ids are being tried, from the
	// caller's address or on this replica, to look this one up now.
	ErrKeyFlood = status.Error(codes.Unavailable, "too many unknown API keys are being tried from your address or on this server; retry shortly")
)

// bearerToken extracts the API key from the values of the "authorization"
// metadata key: exactly one value, "Bearer" (any case), one or more spaces,
// then a token of 1-1024 printable ASCII characters without spaces.
// Surrounding spaces and tabs are ignored. Errors are Unauthenticated
// statuses with a message for the client.
func bearerToken(values []string) (string, error) {
	switch {
	case len(values) == 0:
		return "", errNoCredentials
	case len(values) > 1:
		return "", errBadScheme
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", errNoCredentials
	}
	if len(v) > maxBearerLength+len("Bearer ") {
		return "", errBadScheme
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", errBadScheme
	}
	token = strings.TrimLeft(token, " \t")
	if token == "" || len(token) > maxBearerLength {
		return "", errBadScheme
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c > '~' {
			return "", errBadScheme
		}
	}
	return token, nil
}

// adminKeyID is the key id of a principal authenticated with the bootstrap
// admin key.
const adminKeyID = "admin-key"

// Principal is who a request authenticated as: the scopes it holds and in
// which namespace ("*" = every namespace).
type Principal struct {
	KeyID     string // "admin-key" for the bootstrap key
	Namespace string // "*": a global key
	Scopes    []storage.Scope
}

// Global reports whether the principal's key is global.
func (p *Principal) Global() bool { return p.Namespace == storage.GlobalNamespace }

// Allows reports whether p may use scope on namespace ns. Only a global key
// is allowed on ns "*" (global keys) or on a request that names no
// namespace.
func (p *Principal) Allows(scope storage.Scope, ns string) bool {
	if !p.Global() && (ns == "" || ns != p.Namespace) {
		return false
	}
	for _, s := range p.Scopes {
		if s == scope {
			return true
		}
	}
	return false
}

type principalKey struct{}

// PrincipalFrom returns the request's principal; nil when auth is off.
func PrincipalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// authenticator turns an authorization header into a principal.
type authenticator struct {
	adminHash []byte // nil: no bootstrap key
	keys      func(ctx context.Context, id string) (storage.Key, error)
	logger    *slog.Logger
}

func newAuthenticator(opts Config) *authenticator {
	a := &authenticator{logger: opts.Logger}
	if opts.Auth.AdminKey != "" {
		a.adminHash = HashSecret(opts.Auth.AdminKey)
	}
	a.keys = opts.Tenancy.Key
	return a
}

// authenticate is the go-grpc-middleware auth.AuthFunc: it puts the
// request's principal (lookup) into the context.
func (a *authenticator) authenticate(ctx context.Context) (context.Context, error) {
	p, err := a.lookup(ctx, metadata.ValueFromIncomingContext(ctx, "authorization"))
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, rpcerr.ToStatus(ctx, a.logger, fmt.Errorf("authenticate: %w", err))
	}
	return context.WithValue(storage.WithKeyID(ctx, p.KeyID), principalKey{}, p), nil
}

// lookup reads the bearer token from the authorization values, matches it
// against the bootstrap key and the registry (comparing hashes in constant
// time; the registry's cache first) and returns its principal. A refusal is
// an Unauthenticated status (ErrKeyFlood: Unavailable); an error that is
// not a status is the registry's (it could not answer).
func (a *authenticator) lookup(ctx context.Context, values []string) (*Principal, error) {
	token, err := bearerToken(values)
	if err != nil {
		return nil, err
	}
	hash := HashSecret(token)
	if a.adminHash != nil && subtle.ConstantTimeCompare(hash, a.adminHash) == 1 {
		return &Principal{
			KeyID:     adminKeyID,
			Namespace: storage.GlobalNamespace,
			Scopes:    []storage.Scope{storage.ScopeProduce, storage.ScopeConsume, storage.ScopeAdmin},
		}, nil
	}
	id, ok := parseAPIKey(token)
	if !ok {
		return nil, errBadKey
	}
	// A lookup the cache cannot answer is charged to the caller's address
	// first (tenancy: the miss budgets).
	if p, ok := peer.FromContext(ctx); ok {
		if caller, ok := PeerOf(p.Addr); ok {
			ctx = tenancy.WithCaller(ctx, caller.String())
		}
	}
	k, err := a.keys(ctx, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, errBadKey
	}
	if errors.Is(err, tenancy.ErrTooManyKeyMisses) {
		return nil, ErrKeyFlood // not logged: it is what a flood looks like
	}
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(hash, k.Hash) != 1 {
		return nil, errBadKey
	}
	return &Principal{KeyID: k.ID, Namespace: k.Namespace, Scopes: k.Scopes}, nil
}

// PeerOf is the peer an address counts as, for the limits kept per peer
// (idle connections, streams that need no key, lookups of unknown keys):
// its IPv4 address, or its IPv6 address's /64, which one host gets as
// easily as one address. ok is false for an address that is not TCP.
func PeerOf(a net.Addr) (netip.Prefix, bool) {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, false
	}
	return PeerOfAddrPort(t.AddrPort()), true
}

// PeerOfAddrPort is PeerOf for an address and port.
func PeerOfAddrPort(a netip.AddrPort) netip.Prefix {
	ip := a.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// OpenMethod reports whether a method needs no API key: the health
// service and server reflection (which is only registered when enabled).
// The server bounds the streams of these methods by connection and peer
// instead (server/keyless.go).
func OpenMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.v1.ServerReflection/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.v1alpha.ServerReflection/")
}

// rule is how one RPC is authorized: the scope it needs and the namespace
// it acts on.
type rule struct {
	scope storage.Scope
	// orScope, if set, is a second scope that is enough on its own
	// (WatchDeliveries: consume or admin).
	orScope storage.Scope
	// anyKey: every authenticated key may call it (WhoAmI).
	anyKey bool
	// ns returns the namespace the request names ("" for none, "*" for the
	// global keys). Nil for RPCs whose namespace is looked up (RevokeKey).
	ns func(req any) string
	// field is the request field ns reads, for InvalidArgument messages:
	// the name is validated before the key's permissions are checked, so a
	// malformed name is answered InvalidArgument, never PermissionDenied.
	field string
	// star: "*" (the global keys) is a valid ns (CreateKey, ListKeys).
	star bool
	// global: only a global key may call it (the namespace list and
	// creating namespaces).
	global bool
}

func reqNamespace(req any) string {
	r, ok := req.(interface{ GetNamespace() string })
	if !ok {
		return ""
	}
	return r.GetNamespace()
}

func reqNamespaceMsgName(req any) string {
	r, ok := req.(interface{ GetNamespace() *delaydv1.Namespace })
	if !ok {
		return ""
	}
	return r.GetNamespace().GetName()
}

// rules maps every delayd RPC to how it is authorized. A method missing
// here is refused (default deny); a test checks every registered method has
// a rule.
var rules = map[string]rule{
	delaydv1.TaskService_UpsertTask_FullMethodName:       {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_BatchUpsertTasks_FullMethodName: {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_RemoveTask_FullMethodName:       {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_RemoveTasks_FullMethodName:      {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_GetTask_FullMethodName:          {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_ListTasks_FullMethodName:        {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},
	delaydv1.TaskService_GetTaskHistory_FullMethodName:   {scope: storage.ScopeProduce, ns: reqNamespace, field: "namespace"},

	delaydv1.DeliveryService_Subscribe_FullMethodName:        {scope: storage.ScopeConsume, ns: reqNamespace, field: "namespace"},
	delaydv1.DeliveryService_StreamDeliveries_FullMethodName: {scope: storage.ScopeConsume, ns: reqNamespace, field: "namespace"},
	delaydv1.DeliveryService_AckTasks_FullMethodName:         {scope: storage.ScopeConsume, ns: reqNamespace, field: "namespace"},
	delaydv1.DeliveryService_NackTasks_FullMethodName:        {scope: storage.ScopeConsume, ns: reqNamespace, field: "namespace"},
	delaydv1.DeliveryService_ExtendLease_FullMethodName:      {scope: storage.ScopeConsume, ns: reqNamespace, field: "namespace"},
	delaydv1.DeliveryService_WatchDeliveries_FullMethodName:  {scope: storage.ScopeConsume, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},

	delaydv1.NamespaceService_CreateNamespace_FullMethodName:    {scope: storage.ScopeAdmin, ns: reqNamespaceMsgName, field: "namespace.name", global: true},
	delaydv1.NamespaceService_ListNamespaces_FullMethodName:     {scope: storage.ScopeAdmin, global: true},
	delaydv1.NamespaceService_GetNamespace_FullMethodName:       {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_UpdateNamespace_FullMethodName:    {scope: storage.ScopeAdmin, ns: reqNamespaceMsgName, field: "namespace.name"},
	delaydv1.NamespaceService_DeleteNamespace_FullMethodName:    {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_GetNamespaceStats_FullMethodName:  {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_ListDeadLetters_FullMethodName:    {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_RequeueDeadLetters_FullMethodName: {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_PurgeDeadLetters_FullMethodName:   {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.NamespaceService_CreateKey_FullMethodName:          {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace", star: true},
	delaydv1.NamespaceService_ListKeys_FullMethodName:           {scope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace", star: true},
	delaydv1.NamespaceService_RevokeKey_FullMethodName:          {scope: storage.ScopeAdmin}, // namespace of the key, looked up
	delaydv1.NamespaceService_WhoAmI_FullMethodName:             {anyKey: true},

	// Schedules: a namespace's producers manage its recurring tasks (each
	// firing is a task they could have upserted); its admins may too.
	delaydv1.ScheduleService_CreateSchedule_FullMethodName:  {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqScheduleNamespace, field: "schedule.namespace"},
	delaydv1.ScheduleService_UpdateSchedule_FullMethodName:  {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqScheduleNamespace, field: "schedule.namespace"},
	delaydv1.ScheduleService_GetSchedule_FullMethodName:     {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.ScheduleService_ListSchedules_FullMethodName:   {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.ScheduleService_PauseSchedule_FullMethodName:   {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.ScheduleService_ResumeSchedule_FullMethodName:  {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.ScheduleService_DeleteSchedule_FullMethodName:  {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
	delaydv1.ScheduleService_PreviewSchedule_FullMethodName: {scope: storage.ScopeProduce, orScope: storage.ScopeAdmin, ns: reqNamespace, field: "namespace"},
}

// reqScheduleNamespace is the namespace of a request carrying a Schedule.
func reqScheduleNamespace(req any) string {
	r, ok := req.(interface{ GetSchedule() *delaydv1.Schedule })
	if !ok {
		return ""
	}
	return r.GetSchedule().GetNamespace()
}

// validate checks the part of req that authorization reads — the
// namespace name, or RevokeKey's key id — so a malformed one is answered
// InvalidArgument naming the field, the same answer the handler gives
// without auth, instead of PermissionDenied.
func (r rule) validate(req any) error {
	if rk, ok := req.(*delaydv1.RevokeKeyRequest); ok {
		return ValidateKeyID(rk.GetId())
	}
	if r.ns == nil {
		return nil
	}
	if r.star {
		return ValidateKeyNamespace(r.ns(req))
	}
	if err := storage.ValidateNamespace(r.ns(req)); err != nil {
		return rpcerr.InvalidWrap(r.field, err)
	}
	return nil
}

// authorizer checks a principal against the rules.
type authorizer struct {
	registry storage.Registry // for RevokeKey's lookup
	logger   *slog.Logger
}

// authorize returns nil when the request's principal may call method with
// req, or a PermissionDenied status saying which scope on which namespace
// is missing. It runs only when auth is on, after authentication; a request
// without a principal is refused.
func (z *authorizer) authorize(ctx context.Context, method string, req any) error {
	p := PrincipalFrom(ctx)
	if p == nil {
		return status.Error(codes.Unauthenticated, errNoCredentials.Error())
	}
	r, ok := rules[method]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no authorization rule; refused", method)
	}
	if r.anyKey {
		return nil
	}
	if err := r.validate(req); err != nil {
		return rpcerr.ToStatus(ctx, z.logger, err)
	}
	if r.global {
		if !p.Global() || !p.Allows(r.scope, storage.GlobalNamespace) {
			return status.Errorf(codes.PermissionDenied, "API key %s may not call %s: it needs a global key with the %s scope", p.KeyID, shortMethod(method), r.scope)
		}
		return nil
	}
	var ns string
	if r.ns != nil {
		ns = r.ns(req)
	} else {
		// RevokeKey: the key's own namespace decides.
		id := ""
		if rk, ok := req.(*delaydv1.RevokeKeyRequest); ok {
			id = rk.GetId()
		}
		if p.Global() && p.Allows(r.scope, storage.GlobalNamespace) {
			return nil // a global admin may revoke any key
		}
		k, err := z.registry.GetKey(ctx, id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			if p.Allows(r.scope, p.Namespace) {
				return nil // the handler answers NotFound; ids are public
			}
			return status.Errorf(codes.PermissionDenied, "API key %s may not revoke key %q", p.KeyID, id)
		case err != nil:
			return rpcerr.ToStatus(ctx, z.logger, fmt.Errorf("authorize revoke: %w", err))
		}
		ns = k.Namespace
	}
	if r.orScope != storage.ScopeUnspecified && p.Allows(r.orScope, ns) {
		return nil
	}
	if !p.Allows(r.scope, ns) {
		if !p.Global() && ns != p.Namespace {
			// Name only the caller's own scope: never confirm or echo
			// another tenant's namespace.
			return status.Errorf(codes.PermissionDenied, "API key %s belongs to namespace %q and may not call %s on another namespace", p.KeyID, p.Namespace, shortMethod(method))
		}
		if r.orScope != storage.ScopeUnspecified {
			return status.Errorf(codes.PermissionDenied, "API key %s has neither the %s nor the %s scope on namespace %q", p.KeyID, r.scope, r.orScope, ns)
		}
		return status.Errorf(codes.PermissionDenied, "API key %s has no %s scope on namespace %q", p.KeyID, r.scope, ns)
	}
	return nil
}

// shortMethod turns "/delayd.v1.TaskService/UpsertTask" into
// "TaskService.UpsertTask" for messages.
func shortMethod(full string) string {
	full = strings.TrimPrefix(full, "/")
	svc, m, _ := strings.Cut(full, "/")
	if i := strings.LastIndexByte(svc, '.'); i >= 0 {
		svc = svc[i+1:]
	}
	return svc + "." + m
}

func (z *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := z.authorize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (z *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &firstMessageStream{ServerStream: ss, check: func(m any) error {
		return z.authorize(ss.Context(), info.FullMethod, m)
	}})
}

// firstMessageStream runs check on the first message a client sends (the
// Subscribe request names the namespace); an error from check is what
// RecvMsg returns, so the handler never sees the message.
type firstMessageStream struct {
	grpc.ServerStream
	check func(m any) error
	done  bool
	err   error
}

func (s *firstMessageStream) RecvMsg(m any) error {
	if s.done && s.err != nil {
		return s.err
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.done {
		s.done = true
		s.err = s.check(m)
	}
	return s.err
}

// authInterceptors returns the authentication interceptors (go-grpc-middleware
// auth, behind a selector that leaves health and reflection open) followed
// by authorization.
func authInterceptors(authn *authenticator, authz *authorizer) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	needsKey := selector.MatchFunc(func(_ context.Context, c callmeta.CallMeta) bool {
		return !OpenMethod(c.FullMethod())
	})
	unary := []grpc.UnaryServerInterceptor{
		selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(authn.authenticate), needsKey),
		selector.UnaryServerInterceptor(authz.unary, needsKey),
	}
	stream := []grpc.StreamServerInterceptor{
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(authn.authenticate), needsKey),
		selector.StreamServerInterceptor(authz.stream, needsKey),
	}
	return unary, stream
}

// ValidateKeyID accepts a key id as newAPIKey makes them.
func ValidateKeyID(id string) error {
	if !validKeyID(id) {
		return rpcerr.Invalidf("id", "is %q; allowed: the %d hex characters after dk_ in a key (as ListKeys shows)", id, apiKeyIDLen)
	}
	return nil
}

// ValidateKeyNamespace accepts "*" (global keys) or a valid namespace name.
func ValidateKeyNamespace(ns string) error {
	if ns == storage.GlobalNamespace {
		return nil
	}
	if err := storage.ValidateNamespace(ns); err != nil {
		return rpcerr.Invalidf("namespace", "%s; or \"*\" for a global key", err.Error())
	}
	return nil
}
