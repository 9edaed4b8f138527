package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// This file holds NamespaceService's namespace and API-key RPCs (the
// dead-letter and stats RPCs are in namespace.go). Every one of them needs
// Options.Registry; without it they answer Unimplemented. Authorization
// (which key may call what) happens before them, in the guard (guard/auth.go); the one rule
// that needs the request's content is here: only a global admin may change
// a namespace's limits (quota fields), a namespace's own admin may tune its
// retry policy.

// Admin RPC limits.
const (
	maxKeyDescription = 256
	// defaultNamespacePage and maxNamespacePage bound ListNamespaces.
	defaultNamespacePage = 100
	maxNamespacePage     = 1000
	// namespaceListToken marks page tokens of ListNamespaces;
	// keyListToken, followed by the namespace, those of ListKeys.
	namespaceListToken = "*namespaces"
	keyListToken       = "*keys:"
	// listEntryOverhead is what one element of a repeated field adds to
	// its message's size beyond the element itself (tag and length).
	listEntryOverhead = 8
)

// checkPushURL refuses a push URL this server may not push to: push
// disabled (FailedPrecondition naming the flag), or a URL the operator's
// allow list does not admit (InvalidArgument naming the field and what is
// allowed). It may resolve the URL's host, so it runs before the
// registry's update.
func (s *namespaceService) checkPushURL(ctx context.Context, field, url string) error {
	if s.opts.PushAllow == nil || !s.opts.PushAllow.Enabled() {
		return status.Errorf(codes.FailedPrecondition,
			"%s: push is disabled on this server; the operator enables it by listing the allowed hosts or CIDRs in --push-allow (environment DELAYD_PUSH_ALLOW)", field)
	}
	if err := s.opts.PushAllow.CheckURL(ctx, url); err != nil {
		return rpcerr.Invalidf(field, "%s", err.Error())
	}
	return nil
}

// checkPushSecret refuses a push target without a secret: there is
// nothing to sign its requests with.
func checkPushSecret(prefix string, eff storage.Policy) error {
	if eff.Push.Enabled() && eff.Push.Secret == "" {
		return rpcerr.Invalidf(prefix+"push.secret", "is required when push is set (%d-%d bytes); it signs every request (Delayd-Signature)", minPushSecretBytes, maxPushSecretBytes)
	}
	return nil
}

// defaults returns the server default policy.
func (s *namespaceService) defaults() storage.Policy {
	return s.opts.Tenancy.Defaults()
}

// checkConsistent rejects an effective policy whose fields contradict each
// other.
func checkConsistent(prefix string, eff storage.Policy) error {
	if eff.Backoff.Initial > eff.Backoff.Max {
		return rpcerr.Invalidf(prefix+"backoff_initial", "is %s, more than backoff_max %s; allowed: at most backoff_max",
			eff.Backoff.Initial, eff.Backoff.Max)
	}
	return nil
}

func (s *namespaceService) namespaceToProto(n storage.Namespace) *delaydv1.Namespace {
	return &delaydv1.Namespace{
		Name:       n.Name,
		Policy:     policyToProto(n.Policy.WithDefaults(s.defaults())),
		CreateTime: wire.Time(n.CreateTime),
		UpdateTime: wire.Time(n.UpdateTime),
	}
}

// audit logs an admin action with the key that did it.
func (s *namespaceService) audit(ctx context.Context, msg string, attrs ...slog.Attr) {
	who := "no-auth"
	if p := guard.PrincipalFrom(ctx); p != nil {
		who = p.KeyID
	}
	s.logger.LogAttrs(ctx, slog.LevelInfo, msg, append(attrs, slog.String("by_key", who))...)
}

// CreateNamespace creates a namespace with its policy (zero fields = server
// defaults) and returns it with the effective policy.
func (s *namespaceService) CreateNamespace(ctx context.Context, req *delaydv1.CreateNamespaceRequest) (*delaydv1.CreateNamespaceResponse, error) {
	reg := s.opts.Tenancy
	if req.GetNamespace() == nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("namespace", "is required: {name, policy}"))
	}
	name := req.GetNamespace().GetName()
	if err := validateNamespace("namespace.name", name); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	pol, err := policyFromProto("namespace.policy.", req.GetNamespace().GetPolicy())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if err := checkConsistent("namespace.policy.", pol.WithDefaults(s.defaults())); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if pol.Push.Enabled() {
		if err := s.checkPushURL(ctx, "namespace.policy.push.url", pol.Push.URL); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		if err := checkPushSecret("namespace.policy.", pol); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
	}
	n, err := reg.CreateNamespace(ctx, storage.Namespace{Name: name, Policy: pol})
	if errors.Is(err, storage.ErrAlreadyExists) {
		return nil, status.Errorf(codes.AlreadyExists, "namespace %q already exists", name)
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("create namespace: %w", err))
	}
	if pol.Push.Enabled() {
		// Every replica starts pushing the namespace now, not when its
		// first task is upserted.
		s.opts.Subscriptions.PolicyChanged(ctx, name)
	}
	s.audit(ctx, "namespace created", slog.String("namespace", name))
	return &delaydv1.CreateNamespaceResponse{Namespace: s.namespaceToProto(n)}, nil
}

// GetNamespace returns a namespace with its effective policy.
func (s *namespaceService) GetNamespace(ctx context.Context, req *delaydv1.GetNamespaceRequest) (*delaydv1.GetNamespaceResponse, error) {
	reg := s.opts.Tenancy
	if err := validateNamespace("namespace", req.GetNamespace()); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	n, err := reg.GetNamespace(ctx, req.GetNamespace())
	if errors.Is(err, storage.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "namespace %q not found", req.GetNamespace())
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("get namespace: %w", err))
	}
	return &delaydv1.GetNamespaceResponse{Namespace: s.namespaceToProto(n)}, nil
}

// ListNamespaces pages through namespaces in name order.
func (s *namespaceService) ListNamespaces(ctx context.Context, req *delaydv1.ListNamespacesRequest) (*delaydv1.ListNamespacesResponse, error) {
	reg := s.opts.Tenancy
	size, err := adminPageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	after, err := decodePageToken(req.GetPageToken(), namespaceListToken, storage.StateUnspecified)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if after != "" && storage.ValidateNamespace(after) != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("page_token", "is not a token this server issued; start again with an empty page_token"))
	}
	nss, more, err := reg.ListNamespaces(ctx, after, size)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("list namespaces: %w", err))
	}
	resp := &delaydv1.ListNamespacesResponse{Namespaces: make([]*delaydv1.Namespace, 0, len(nss))}
	used := 0
	for _, n := range nss {
		pn := s.namespaceToProto(n)
		size := proto.Size(pn) + listEntryOverhead
		if len(resp.Namespaces) > 0 && used+size > s.limits.MaxListBytes {
			more = true
			break
		}
		used += size
		resp.Namespaces = append(resp.Namespaces, pn)
	}
	if more && len(resp.Namespaces) > 0 {
		resp.NextPageToken = encodePageToken(namespaceListToken, storage.StateUnspecified, resp.Namespaces[len(resp.Namespaces)-1].GetName())
	}
	return resp, nil
}

// UpdateNamespace changes the policy fields update_mask names ("policy.x";
// "policy" or "*": every field). A request without a mask is refused
// naming update_mask: proto3 cannot tell a field set to its zero value
// (paused: false, max_dispatch_rate: 0) from one left out, so neither
// "every field" (a pause that wipes the rate cap) nor AIP-134's "the fields
// present" (a resume that changes nothing) would do what the caller meant.
// Zero values reset a masked field to the server default. Only a global admin key may change quota fields
// (max_payload_bytes, max_pending_tasks, rate_limit, rate_burst,
// max_subscribers, max_delay); the namespace's own admin may change the rest.
func (s *namespaceService) UpdateNamespace(ctx context.Context, req *delaydv1.UpdateNamespaceRequest) (*delaydv1.UpdateNamespaceResponse, error) {
	reg := s.opts.Tenancy
	if req.GetNamespace() == nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("namespace", "is required: {name, policy}"))
	}
	name := req.GetNamespace().GetName()
	if err := validateNamespace("namespace.name", name); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	fields, err := maskedPolicyFields(req.GetUpdateMask().GetPaths())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	src := req.GetNamespace().GetPolicy()
	var scratch storage.Policy // validate every masked field before the store sees anything
	for _, f := range fields {
		if err := f.set(&scratch, src, "namespace.policy."+f.name); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
	}
	pushMasked := slices.ContainsFunc(fields, func(f policyField) bool { return f.name == "push" })
	if pushMasked && scratch.Push.Enabled() {
		if err := s.checkPushURL(ctx, "namespace.policy.push.url", scratch.Push.URL); err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
	}
	p := guard.PrincipalFrom(ctx)
	defaults := s.defaults()
	n, err := reg.UpdateNamespace(ctx, name, func(cur storage.Policy) (storage.Policy, error) {
		out := cur
		for _, f := range fields {
			_ = f.set(&out, src, "") // validated above
		}
		oldEff, newEff := cur.WithDefaults(defaults), out.WithDefaults(defaults)
		if err := checkConsistent("namespace.policy.", newEff); err != nil {
			return storage.Policy{}, err
		}
		if newEff.Shards != oldEff.Shards {
			return storage.Policy{}, status.Errorf(codes.FailedPrecondition,
				"namespace.policy.shards: is %d; the namespace has %d shards, and the count cannot change after create "+
					"(a task's shard is a hash of its id modulo the count; moving tasks between shards without losing or "+
					"duplicating one is not supported): create a new namespace with the shards wanted and move producers to it",
				newEff.Shards, oldEff.Shards)
		}
		if err := checkPushSecret("namespace.policy.", newEff); err != nil {
			return storage.Policy{}, err
		}
		if p != nil && !p.Global() {
			for _, f := range fields {
				if f.quota && !f.same(oldEff, newEff) {
					return storage.Policy{}, status.Errorf(codes.PermissionDenied,
						"API key %s may not change namespace.policy.%s: quota fields need a global admin key", p.KeyID, f.name)
				}
			}
		}
		return out, nil
	})
	var refused interface{ GRPCStatus() *status.Status }
	switch {
	case errors.As(err, &refused): // from the update function
		return nil, refused.GRPCStatus().Err()
	case errors.Is(err, storage.ErrNotFound):
		return nil, status.Errorf(codes.NotFound, "namespace %q not found", name)
	case err != nil:
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("update namespace: %w", err))
	}
	// Every replica's dispatcher applies the new policy now (a pause stops
	// deliveries, a resume restarts them), not at its next refresh.
	s.opts.Subscriptions.PolicyChanged(ctx, name)
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	s.audit(ctx, "namespace updated", slog.String("namespace", name), slog.String("fields", strings.Join(names, ",")))
	return &delaydv1.UpdateNamespaceResponse{Namespace: s.namespaceToProto(n)}, nil
}

// maskedPolicyFields resolves update_mask paths to policy fields. "policy"
// or "*" means every field; no path at all is refused (see UpdateNamespace). A field's path may be spelt as the proto
// names it (policy.max_dispatch_rate) or in lowerCamelCase as JSON writes
// it (policy.maxDispatchRate): protojson turns the JSON string form of a
// FieldMask into snake_case, but a client that sends the paths as an
// object (grpcurl's {"paths": [...]}) passes them through as written.
func maskedPolicyFields(paths []string) ([]policyField, error) {
	if len(paths) == 0 {
		return nil, rpcerr.Invalidf("update_mask", "is required: name the policy fields to change, e.g. "+
			`{"paths": ["policy.paused"]}; "policy" replaces every field (those left unset go back to the server defaults); allowed: %s`+camelNote,
			strings.Join(policyPaths(), ", "))
	}
	var out []policyField
	for i, path := range paths {
		if path == "policy" || path == "*" {
			return policyFields, nil
		}
		name, ok := strings.CutPrefix(path, "policy.")
		j := slices.IndexFunc(policyFields, func(f policyField) bool { return f.name == name || lowerCamel(f.name) == name })
		if !ok || j < 0 {
			return nil, rpcerr.Invalidf(fmt.Sprintf("update_mask.paths[%d]", i), "is %q; allowed: %s"+camelNote,
				path, strings.Join(policyPaths(), ", "))
		}
		name = policyFields[j].name
		if !slices.ContainsFunc(out, func(f policyField) bool { return f.name == name }) {
			out = append(out, policyFields[j])
		}
	}
	return out, nil
}

// policyPaths are the update_mask paths UpdateNamespace accepts, as an
// error message lists them.
func policyPaths() []string {
	out := []string{"policy"}
	for _, f := range policyFields {
		out = append(out, "policy."+f.name)
	}
	return out
}

// camelNote follows the list of allowed update_mask paths in an error.
const camelNote = " (each also in lowerCamelCase, as JSON writes it: policy.maxDispatchRate)"

// lowerCamel is a snake_case proto field name as JSON spells it:
// max_dispatch_rate → maxDispatchRate.
func lowerCamel(snake string) string {
	var b strings.Builder
	up := false
	for _, r := range snake {
		switch {
		case r == '_':
			up = true
		case up:
			b.WriteRune(unicode.ToUpper(r))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// DeleteNamespace deletes a namespace and its API keys. A namespace that
// still has tasks is refused with FailedPrecondition unless force is set;
// then its tasks are deleted first (the namespace record last, so a failed
// delete can be retried).
func (s *namespaceService) DeleteNamespace(ctx context.Context, req *delaydv1.DeleteNamespaceRequest) (*delaydv1.DeleteNamespaceResponse, error) {
	reg := s.opts.Tenancy
	name := req.GetNamespace()
	if err := validateNamespace("namespace", name); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	n, err := reg.GetNamespace(ctx, name)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "namespace %q not found", name)
	} else if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("delete namespace: %w", err))
	}
	st, err := s.opts.Store.Stats(ctx, name)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("delete namespace: count: %w", err))
	}
	total := st.Scheduled + st.Delivered + st.Dead
	if total > 0 && !req.GetForce() {
		return nil, status.Errorf(codes.FailedPrecondition,
			"namespace %q still has tasks (%d scheduled, %d delivered, %d dead): remove them first, or delete with force to delete them too",
			name, st.Scheduled, st.Delivered, st.Dead)
	}
	// End the namespace's incarnation in the task store before its record
	// goes: from then on no upsert made through a replica's stale view of
	// it (cached for up to a second) is written, so none survives into a
	// namespace re-created under the same name. The drop then takes every
	// task, including any written since the count above.
	deleted, err := s.opts.Store.DropNamespace(ctx, name, n.Incarnation())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("delete namespace: drop tasks: %w", err))
	}
	// Its schedules go with it, as its keys do (a step racing the drop is
	// refused: the incarnation has ended).
	if _, err := s.opts.Schedules.Drop(ctx, name); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("delete namespace: drop schedules: %w", err))
	}
	if err := reg.DeleteNamespace(ctx, name); err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("delete namespace: %w", err))
	}
	s.guard.NamespaceEnded(name)
	s.audit(ctx, "namespace deleted", slog.String("namespace", name), slog.Int64("deleted_tasks", deleted))
	return &delaydv1.DeleteNamespaceResponse{DeletedTasks: deleted}, nil
}

// keyScopesFromProto validates and de-duplicates requested scopes.
func keyScopesFromProto(in []delaydv1.KeyScope) ([]storage.Scope, error) {
	if len(in) == 0 {
		return nil, rpcerr.Invalidf("scopes", "is empty; allowed: one or more of KEY_SCOPE_PRODUCE, KEY_SCOPE_CONSUME, KEY_SCOPE_ADMIN")
	}
	var out []storage.Scope
	for i, sc := range in {
		s, ok := wire.ScopeFrom(sc)
		if !ok {
			return nil, rpcerr.Invalidf(fmt.Sprintf("scopes[%d]", i), "is %d; allowed: KEY_SCOPE_PRODUCE, KEY_SCOPE_CONSUME, KEY_SCOPE_ADMIN", int32(sc))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, nil
}

func keyToProto(k storage.Key) *delaydv1.Key {
	scopes := make([]delaydv1.KeyScope, len(k.Scopes))
	for i, s := range k.Scopes {
		scopes[i] = wire.Scope(s)
	}
	return &delaydv1.Key{
		Id:          k.ID,
		Namespace:   k.Namespace,
		Scopes:      scopes,
		Description: k.Description,
		CreateTime:  wire.Time(k.CreateTime),
	}
}

// CreateKey creates an API key and returns its secret, once. delayd keeps
// only the secret's SHA-256.
func (s *namespaceService) CreateKey(ctx context.Context, req *delaydv1.CreateKeyRequest) (*delaydv1.CreateKeyResponse, error) {
	reg := s.opts.Tenancy
	ns := req.GetNamespace()
	if err := guard.ValidateKeyNamespace(ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	scopes, err := keyScopesFromProto(req.GetScopes())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	desc := req.GetDescription()
	if err := validateDescription(desc); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if ns != storage.GlobalNamespace {
		if err := s.namespaceExists(ctx, reg, ns); err != nil {
			return nil, err
		}
	}
	// Keys per namespace, and global keys, are capped (Limits.MaxKeys), so
	// no admin grows the registry (and ListKeys) without bound. Keys
	// created at the same moment on several replicas can pass the count
	// together and overshoot by as many.
	keys, _, err := reg.ListKeys(ctx, ns, storage.KeyCursor{}, s.limits.MaxKeys)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("create key: count: %w", err))
	}
	if len(keys) >= s.limits.MaxKeys {
		if ns == storage.GlobalNamespace {
			return nil, status.Errorf(codes.ResourceExhausted,
				"there are already %d global API keys (at most %d, --max-keys); revoke keys no longer used", len(keys), s.limits.MaxKeys)
		}
		return nil, status.Errorf(codes.ResourceExhausted,
			"namespace %q already has %d API keys (at most %d, --max-keys); revoke keys it no longer uses", ns, len(keys), s.limits.MaxKeys)
	}
	for attempt := 0; ; attempt++ {
		id, secret, err := guard.NewAPIKey()
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, err)
		}
		k := storage.Key{
			ID:          id,
			Namespace:   ns,
			Scopes:      scopes,
			Description: desc,
			CreateTime:  s.opts.Clock.Now().Truncate(time.Millisecond),
			Hash:        guard.HashSecret(secret),
		}
		err = reg.CreateKey(ctx, k)
		if errors.Is(err, storage.ErrAlreadyExists) && attempt < 3 {
			continue // a 64-bit id collided: draw again
		}
		if err != nil {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("create key: %w", err))
		}
		s.audit(ctx, "API key created", slog.String("key_id", id), slog.String("namespace", ns))
		return &delaydv1.CreateKeyResponse{Key: keyToProto(k), Secret: secret}, nil
	}
}

// namespaceExists answers NotFound for an unknown namespace, creating it
// instead when the server auto-creates namespaces.
func (s *namespaceService) namespaceExists(ctx context.Context, reg storage.Registry, ns string) error {
	_, err := reg.GetNamespace(ctx, ns)
	if errors.Is(err, storage.ErrNotFound) {
		_, err = s.opts.Tenancy.Namespace(ctx, ns, true) // auto-creates when configured
	}
	if errors.Is(err, storage.ErrNotFound) {
		return status.Errorf(codes.NotFound, "namespace %q not found: create it first", ns)
	}
	if err != nil {
		return rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("namespace: %w", err))
	}
	return nil
}

func validateDescription(d string) error {
	if !utf8.ValidString(d) {
		return rpcerr.Invalidf("description", "is not valid UTF-8; allowed: at most %d printable characters", maxKeyDescription)
	}
	if n := utf8.RuneCountInString(d); n > maxKeyDescription {
		return rpcerr.Invalidf("description", "is %d characters long; at most %d are allowed", n, maxKeyDescription)
	}
	for i, r := range d {
		if !unicode.IsPrint(r) {
			return rpcerr.Invalidf("description", "has the non-printable character %U at byte %d; allowed: at most %d printable characters", r, i, maxKeyDescription)
		}
	}
	return nil
}

// ListKeys pages through the keys of a namespace ("*": the global keys),
// newest first, never their secrets. A page holds at most page_size keys
// and at most Limits.MaxListBytes.
func (s *namespaceService) ListKeys(ctx context.Context, req *delaydv1.ListKeysRequest) (*delaydv1.ListKeysResponse, error) {
	reg := s.opts.Tenancy
	ns := req.GetNamespace()
	if err := guard.ValidateKeyNamespace(ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	size, err := adminPageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	cursor, err := decodePageToken(req.GetPageToken(), keyListToken+ns, storage.StateUnspecified)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	after, err := parseKeyCursor(cursor)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	keys, more, err := reg.ListKeys(ctx, ns, after, size)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("list keys: %w", err))
	}
	resp := &delaydv1.ListKeysResponse{Keys: make([]*delaydv1.Key, 0, len(keys))}
	used := 0
	for _, k := range keys {
		pk := keyToProto(k)
		n := proto.Size(pk) + listEntryOverhead
		if len(resp.Keys) > 0 && used+n > s.limits.MaxListBytes {
			more = true
			break
		}
		used += n
		resp.Keys = append(resp.Keys, pk)
	}
	if more && len(resp.Keys) > 0 {
		last := keys[len(resp.Keys)-1]
		resp.NextPageToken = encodePageToken(keyListToken+ns, storage.StateUnspecified,
			strconv.FormatInt(last.CreateTime.UnixMilli(), 10)+":"+last.ID)
	}
	return resp, nil
}

// parseKeyCursor reads a ListKeys cursor, "<create ms>:<key id>"; "" is the
// zero cursor (the newest key).
func parseKeyCursor(c string) (storage.KeyCursor, error) {
	if c == "" {
		return storage.KeyCursor{}, nil
	}
	msText, id, ok := strings.Cut(c, ":")
	ms, err := strconv.ParseInt(msText, 10, 64)
	if !ok || err != nil || id == "" || len(id) > 64 || strings.ContainsFunc(id, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) {
		return storage.KeyCursor{}, rpcerr.Invalidf("page_token", "is not a token this server issued; start again with an empty page_token")
	}
	return storage.KeyCursor{CreateTime: time.UnixMilli(ms), ID: id}, nil
}

// adminPageSize resolves the page_size of ListNamespaces and ListKeys.
func adminPageSize(n int32) (int, error) {
	switch {
	case n == 0:
		return defaultNamespacePage, nil
	case n < 0 || n > maxNamespacePage:
		return 0, rpcerr.Invalidf("page_size", "is %d; allowed: 1-%d, or 0 for %d", n, maxNamespacePage, defaultNamespacePage)
	}
	return int(n), nil
}

// RevokeKey deletes a key: it stops working on this replica at once and on
// every other within the registry cache's TTL (1 s by default).
func (s *namespaceService) RevokeKey(ctx context.Context, req *delaydv1.RevokeKeyRequest) (*delaydv1.RevokeKeyResponse, error) {
	reg := s.opts.Tenancy
	id := req.GetId()
	if err := guard.ValidateKeyID(id); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	err := reg.RevokeKey(ctx, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "API key %q not found", id)
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("revoke key: %w", err))
	}
	s.guard.KeyRevoked(id)
	s.audit(ctx, "API key revoked", slog.String("key_id", id))
	return &delaydv1.RevokeKeyResponse{}, nil
}

// WhoAmI describes the request's key: its id, namespace and scopes. With
// authentication off every caller is a global key with every scope.
func (s *namespaceService) WhoAmI(ctx context.Context, _ *delaydv1.WhoAmIRequest) (*delaydv1.WhoAmIResponse, error) {
	p := guard.PrincipalFrom(ctx)
	if p == nil {
		return &delaydv1.WhoAmIResponse{Key: keyToProto(storage.Key{
			Namespace: storage.GlobalNamespace,
			Scopes:    []storage.Scope{storage.ScopeProduce, storage.ScopeConsume, storage.ScopeAdmin},
		})}, nil
	}
	return &delaydv1.WhoAmIResponse{
		Key:         keyToProto(storage.Key{ID: p.KeyID, Namespace: p.Namespace, Scopes: p.Scopes}),
		AuthEnabled: true,
	}, nil
}
