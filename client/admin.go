package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Admin is the typed client of delayd's admin API (NamespaceService) and of
// DeliveryService.WatchDeliveries, for operator tools such as delayctl. Get
// one with [Client.Admin]; it shares the Client's connection, API key and
// timeout, and is safe for concurrent use. Errors are gRPC status errors
// wrapped with the operation's name, as for the producer.
type Admin struct {
	ns  delaydv1.NamespaceServiceClient
	dlv delaydv1.DeliveryServiceClient
}

// Admin returns the admin client over c's connection.
func (c *Client) Admin() *Admin {
	return &Admin{ns: delaydv1.NewNamespaceServiceClient(c.conn), dlv: c.delivery}
}

// Policy is how delayd treats the tasks of one namespace. A zero field means
// the server default (documented on delayd.v1.NamespacePolicy).
type Policy struct {
	// AckTimeout is the lease a subscriber gets per delivery.
	AckTimeout time.Duration `json:"ack_timeout"`
	// MaxAttempts is the number of deliveries before a task becomes a dead
	// letter.
	MaxAttempts int32 `json:"max_attempts"`
	// BackoffInitial is the first retry delay.
	BackoffInitial time.Duration `json:"backoff_initial"`
	// BackoffMax caps the retry delay.
	BackoffMax time.Duration `json:"backoff_max"`
	// BackoffMultiplier is the factor between consecutive retry delays.
	BackoffMultiplier float64 `json:"backoff_multiplier"`
	// MaxPayloadBytes is the largest payload accepted.
	MaxPayloadBytes int32 `json:"max_payload_bytes"`
	// MaxPendingTasks is the most tasks the namespace may hold; 0 = no limit.
	MaxPendingTasks int64 `json:"max_pending_tasks"`
	// RateLimit is the sustained requests per second allowed; 0 = no limit.
	RateLimit float64 `json:"rate_limit"`
	// RateBurst is the burst above RateLimit.
	RateBurst int32 `json:"rate_burst"`
	// MaxSubscribers is the most concurrent Subscribe streams; 0 = no limit.
	MaxSubscribers int32 `json:"max_subscribers"`
	// MaxDelay is the furthest ahead a task may be due.
	MaxDelay time.Duration `json:"max_delay"`
	// Paused stops the namespace's deliveries on every replica until it is
	// set false again (upserts and acks go on).
	Paused bool `json:"paused"`
	// MaxDispatchRate caps the namespace's deliveries per second across
	// every replica; 0 = unlimited.
	MaxDispatchRate float64 `json:"max_dispatch_rate"`
	// PushURL, if set, is the HTTP endpoint the namespace's due tasks are
	// POSTed to instead of being served to Subscribe streams (only to
	// hosts the server's --push-allow admits); "" = no push.
	PushURL string `json:"push_url,omitempty"`
	// PushSecret signs push requests (16-1024 bytes). Write-only: sent,
	// never answered; empty in an update keeps the stored one.
	PushSecret string `json:"-"`
	// PushSecretSet, in answers, says a push secret is stored.
	PushSecretSet bool `json:"push_secret_set,omitempty"`
	// Shards spreads the namespace's tasks over that many Redis Cluster
	// slots (1-256; 0 = the default, 1). Set at create only: an update that
	// would change it is refused (FailedPrecondition).
	Shards int32 `json:"shards"`
	// HistoryRetentionBytes keeps the namespace's task events (History),
	// about this many bytes of them (64 KiB-1 GiB; 0 = no history). Global
	// admin only.
	HistoryRetentionBytes int64 `json:"history_retention_bytes,omitempty"`
	// MaxSchedules is the most schedules (recurring tasks) the namespace
	// may have (0 = the default, 1,000). Global admin only.
	MaxSchedules int32 `json:"max_schedules"`
}

// PolicyFields are the names UpdateNamespace accepts in its fields list, in
// the order of delayd.v1.NamespacePolicy.
var PolicyFields = []string{
	"ack_timeout", "max_attempts", "backoff_initial", "backoff_max", "backoff_multiplier",
	"max_payload_bytes", "max_pending_tasks", "rate_limit", "rate_burst", "max_subscribers", "max_delay",
	"paused", "max_dispatch_rate", "shards", "push", "history_retention_bytes", "max_schedules",
}

func (p Policy) proto() *delaydv1.NamespacePolicy {
	d := func(v time.Duration) *durationpb.Duration {
		if v == 0 {
			return nil
		}
		return durationpb.New(v)
	}
	return &delaydv1.NamespacePolicy{
		AckTimeout:            d(p.AckTimeout),
		MaxAttempts:           p.MaxAttempts,
		BackoffInitial:        d(p.BackoffInitial),
		BackoffMax:            d(p.BackoffMax),
		BackoffMultiplier:     p.BackoffMultiplier,
		MaxPayloadBytes:       p.MaxPayloadBytes,
		MaxPendingTasks:       p.MaxPendingTasks,
		RateLimit:             p.RateLimit,
		RateBurst:             p.RateBurst,
		MaxSubscribers:        p.MaxSubscribers,
		MaxDelay:              d(p.MaxDelay),
		Paused:                p.Paused,
		MaxDispatchRate:       p.MaxDispatchRate,
		Push:                  pushProto(p.PushURL, p.PushSecret),
		Shards:                p.Shards,
		HistoryRetentionBytes: p.HistoryRetentionBytes,
		MaxSchedules:          p.MaxSchedules,
	}
}

func pushProto(url, secret string) *delaydv1.PushTarget {
	if url == "" && secret == "" {
		return nil
	}
	return &delaydv1.PushTarget{Url: url, Secret: secret}
}

func policyFromProto(p *delaydv1.NamespacePolicy) Policy {
	return Policy{
		AckTimeout:            p.GetAckTimeout().AsDuration(),
		MaxAttempts:           p.GetMaxAttempts(),
		BackoffInitial:        p.GetBackoffInitial().AsDuration(),
		BackoffMax:            p.GetBackoffMax().AsDuration(),
		BackoffMultiplier:     p.GetBackoffMultiplier(),
		MaxPayloadBytes:       p.GetMaxPayloadBytes(),
		MaxPendingTasks:       p.GetMaxPendingTasks(),
		RateLimit:             p.GetRateLimit(),
		RateBurst:             p.GetRateBurst(),
		MaxSubscribers:        p.GetMaxSubscribers(),
		MaxDelay:              p.GetMaxDelay().AsDuration(),
		Paused:                p.GetPaused(),
		MaxDispatchRate:       p.GetMaxDispatchRate(),
		PushURL:               p.GetPush().GetUrl(),
		PushSecretSet:         p.GetPush().GetSecretSet(),
		Shards:                p.GetShards(),
		HistoryRetentionBytes: p.GetHistoryRetentionBytes(),
		MaxSchedules:          p.GetMaxSchedules(),
	}
}

// Namespace is a tenant's queue and its policy.
type Namespace struct {
	// Name of the namespace.
	Name string `json:"name"`
	// Policy as stored (zero fields: server defaults).
	Policy Policy `json:"policy"`
	// CreateTime is when the namespace was created.
	CreateTime time.Time `json:"create_time"`
	// UpdateTime is when it was last updated.
	UpdateTime time.Time `json:"update_time"`
}

func namespaceFromProto(p *delaydv1.Namespace) Namespace {
	return Namespace{
		Name:       p.GetName(),
		Policy:     policyFromProto(p.GetPolicy()),
		CreateTime: timeFromProto(p.GetCreateTime()),
		UpdateTime: timeFromProto(p.GetUpdateTime()),
	}
}

// CreateNamespace creates namespace name with policy p (needs a global admin
// key). AlreadyExists if it exists.
func (a *Admin) CreateNamespace(ctx context.Context, name string, p Policy) (Namespace, error) {
	resp, err := a.ns.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: name, Policy: p.proto()}})
	if err != nil {
		return Namespace{}, fmt.Errorf("delayd create namespace %s: %w", name, err)
	}
	return namespaceFromProto(resp.GetNamespace()), nil
}

// GetNamespace returns namespace name. NotFound if unknown.
func (a *Admin) GetNamespace(ctx context.Context, name string) (Namespace, error) {
	resp, err := a.ns.GetNamespace(ctx, &delaydv1.GetNamespaceRequest{Namespace: name})
	if err != nil {
		return Namespace{}, fmt.Errorf("delayd get namespace %s: %w", name, err)
	}
	return namespaceFromProto(resp.GetNamespace()), nil
}

// Namespaces iterates over every namespace in name order (needs a global
// admin key), one page call at a time. An error ends the iteration after it
// is yielded.
func (a *Admin) Namespaces(ctx context.Context) iter.Seq2[Namespace, error] {
	return func(yield func(Namespace, error) bool) {
		token := ""
		for {
			resp, err := a.ns.ListNamespaces(ctx, &delaydv1.ListNamespacesRequest{PageToken: token})
			if err != nil {
				yield(Namespace{}, fmt.Errorf("delayd list namespaces: %w", err))
				return
			}
			for _, n := range resp.GetNamespaces() {
				if !yield(namespaceFromProto(n), nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}

// UpdateNamespace sets the policy fields named in fields (names from
// [PolicyFields]) to their values in p; fields nil or empty replaces every
// policy field (zero values take the server defaults). It always sends an
// update mask: the server refuses a request without one.
// It returns the namespace as stored.
func (a *Admin) UpdateNamespace(ctx context.Context, name string, p Policy, fields []string) (Namespace, error) {
	req := &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: name, Policy: p.proto()},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	}
	if len(fields) > 0 {
		req.UpdateMask.Paths = req.UpdateMask.Paths[:0]
		for _, f := range fields {
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "policy."+f)
		}
	}
	resp, err := a.ns.UpdateNamespace(ctx, req)
	if err != nil {
		return Namespace{}, fmt.Errorf("delayd update namespace %s: %w", name, err)
	}
	return namespaceFromProto(resp.GetNamespace()), nil
}

// DeleteNamespace deletes namespace name; with force its tasks too
// (otherwise FailedPrecondition while it has tasks). It returns how many
// tasks were deleted.
func (a *Admin) DeleteNamespace(ctx context.Context, name string, force bool) (int64, error) {
	resp, err := a.ns.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: name, Force: force})
	if err != nil {
		return 0, fmt.Errorf("delayd delete namespace %s: %w", name, err)
	}
	return resp.GetDeletedTasks(), nil
}

// Stats counts a namespace's tasks per state.
type Stats struct {
	// Scheduled tasks wait for their due time or for a subscriber.
	Scheduled int64 `json:"scheduled"`
	// Delivered tasks are leased to subscribers.
	Delivered int64 `json:"delivered"`
	// Dead letters.
	Dead int64 `json:"dead"`
	// DueNow are due but not delivered yet.
	DueNow int64 `json:"due_now"`
	// OldestDueLateness is how late the oldest due, undelivered task is.
	OldestDueLateness time.Duration `json:"oldest_due_lateness"`
	// Paused: the namespace's policy stops its deliveries.
	Paused bool `json:"paused"`
	// MaxDispatchRate is the namespace's cap on deliveries per second
	// across every replica; 0 = unlimited.
	MaxDispatchRate float64 `json:"max_dispatch_rate"`
	// Push: the namespace's tasks go to its HTTP push target.
	Push bool `json:"push"`
	// DueByKind counts due tasks per kind ("" = no kind) over the first
	// 1,000 due tasks; DueByKindPartial says more were due.
	DueByKind        map[string]int64 `json:"due_by_kind,omitempty"`
	DueByKindPartial bool             `json:"due_by_kind_partial,omitempty"`
	// DuePerMinute[i] counts scheduled tasks falling due in minute i from
	// ForecastTime (60 minutes); DuePerHour[i] in hour i (24 hours).
	DuePerMinute []int64   `json:"due_per_minute,omitempty"`
	DuePerHour   []int64   `json:"due_per_hour,omitempty"`
	ForecastTime time.Time `json:"forecast_time,omitzero"`
}

// Stats returns namespace name's counts.
func (a *Admin) Stats(ctx context.Context, name string) (Stats, error) {
	resp, err := a.ns.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: name})
	if err != nil {
		return Stats{}, fmt.Errorf("delayd stats %s: %w", name, err)
	}
	return Stats{
		Scheduled:         resp.GetScheduled(),
		Delivered:         resp.GetDelivered(),
		Dead:              resp.GetDead(),
		DueNow:            resp.GetDueNow(),
		OldestDueLateness: resp.GetOldestDueLateness().AsDuration(),
		Paused:            resp.GetPaused(),
		MaxDispatchRate:   resp.GetMaxDispatchRate(),
		Push:              resp.GetPush(),
		DueByKind:         resp.GetDueByKind(),
		DueByKindPartial:  resp.GetDueByKindPartial(),
		DuePerMinute:      resp.GetDuePerMinute(),
		DuePerHour:        resp.GetDuePerHour(),
		ForecastTime:      resp.GetForecastTime().AsTime(),
	}, nil
}

// DeadLetters iterates over the dead tasks of ns, oldest death first, one
// page call at a time. An error ends the iteration after it is yielded.
func (a *Admin) DeadLetters(ctx context.Context, ns string) iter.Seq2[Task, error] {
	return func(yield func(Task, error) bool) {
		token := ""
		for {
			resp, err := a.ns.ListDeadLetters(ctx, &delaydv1.ListDeadLettersRequest{Namespace: ns, PageToken: token})
			if err != nil {
				yield(Task{}, fmt.Errorf("delayd list dead letters %s: %w", ns, err))
				return
			}
			for _, t := range resp.GetTasks() {
				if !yield(taskFromProto(t), nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}

// DeadLetterSelection says which dead letters RequeueDeadLetters and
// PurgeDeadLetters act on: the listed IDs (1-1,000), or All of them.
type DeadLetterSelection struct {
	// IDs of dead tasks; ids that are not dead are skipped.
	IDs []string
	// All selects every dead task of the namespace; IDs must then be empty.
	All bool
}

// RequeueDeadLetters moves the selected dead tasks of ns back to scheduled,
// attempts reset, due after delay (0: at once). It returns how many moved.
func (a *Admin) RequeueDeadLetters(ctx context.Context, ns string, sel DeadLetterSelection, delay time.Duration) (int64, error) {
	req := &delaydv1.RequeueDeadLettersRequest{Namespace: ns, Ids: sel.IDs, All: sel.All}
	if delay > 0 {
		req.Delay = durationpb.New(delay)
	}
	resp, err := a.ns.RequeueDeadLetters(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("delayd requeue dead letters %s: %w", ns, err)
	}
	return resp.GetRequeued(), nil
}

// PurgeDeadLetters deletes the selected dead tasks of ns for good. It
// returns how many were deleted.
func (a *Admin) PurgeDeadLetters(ctx context.Context, ns string, sel DeadLetterSelection) (int64, error) {
	resp, err := a.ns.PurgeDeadLetters(ctx, &delaydv1.PurgeDeadLettersRequest{Namespace: ns, Ids: sel.IDs, All: sel.All})
	if err != nil {
		return 0, fmt.Errorf("delayd purge dead letters %s: %w", ns, err)
	}
	return resp.GetPurged(), nil
}

// Scope is what an API key may do in its namespace.
type Scope int32

// Key scopes; the values are delayd.v1.KeyScope's.
const (
	ScopeProduce Scope = Scope(delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	ScopeConsume Scope = Scope(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	ScopeAdmin   Scope = Scope(delaydv1.KeyScope_KEY_SCOPE_ADMIN)
)

// String returns "produce", "consume", "admin" or "unspecified".
func (s Scope) String() string {
	switch s {
	case ScopeProduce:
		return "produce"
	case ScopeConsume:
		return "consume"
	case ScopeAdmin:
		return "admin"
	}
	return "unspecified"
}

// MarshalText writes the scope's name, so JSON shows "produce", not 1.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ParseScope reads "produce", "consume" or "admin" (any case).
func ParseScope(s string) (Scope, error) {
	switch strings.ToLower(s) {
	case "produce":
		return ScopeProduce, nil
	case "consume":
		return ScopeConsume, nil
	case "admin":
		return ScopeAdmin, nil
	}
	return 0, fmt.Errorf("scope %q: allowed: produce, consume, admin", s)
}

// Key describes an API key (never its secret).
type Key struct {
	// ID is public: it names the key in ListKeys and RevokeKey.
	ID string `json:"id"`
	// Namespace the key is for; "*" for a global key.
	Namespace string `json:"namespace"`
	// Scopes the key grants.
	Scopes []Scope `json:"scopes"`
	// Description is free text for operators.
	Description string `json:"description,omitempty"`
	// CreateTime is when the key was created (zero for the bootstrap key).
	CreateTime time.Time `json:"create_time"`
}

func keyFromProto(p *delaydv1.Key) Key {
	k := Key{ID: p.GetId(), Namespace: p.GetNamespace(), Description: p.GetDescription(), CreateTime: timeFromProto(p.GetCreateTime())}
	for _, s := range p.GetScopes() {
		k.Scopes = append(k.Scopes, Scope(s))
	}
	return k
}

// CreateKey creates an API key for ns ("*": global) with scopes. It returns
// the key and its secret, which delayd shows only this once.
func (a *Admin) CreateKey(ctx context.Context, ns string, scopes []Scope, description string) (Key, string, error) {
	req := &delaydv1.CreateKeyRequest{Namespace: ns, Description: description}
	for _, s := range scopes {
		req.Scopes = append(req.Scopes, delaydv1.KeyScope(s))
	}
	resp, err := a.ns.CreateKey(ctx, req)
	if err != nil {
		return Key{}, "", fmt.Errorf("delayd create key for %s: %w", ns, err)
	}
	return keyFromProto(resp.GetKey()), resp.GetSecret(), nil
}

// Keys lists the keys of ns ("*": global keys), newest first, reading
// every page.
func (a *Admin) Keys(ctx context.Context, ns string) ([]Key, error) {
	var out []Key
	token := ""
	for {
		resp, err := a.ns.ListKeys(ctx, &delaydv1.ListKeysRequest{Namespace: ns, PageSize: 1000, PageToken: token})
		if err != nil {
			return nil, fmt.Errorf("delayd list keys %s: %w", ns, err)
		}
		for _, k := range resp.GetKeys() {
			out = append(out, keyFromProto(k))
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// RevokeKey revokes key id at once. NotFound if unknown.
func (a *Admin) RevokeKey(ctx context.Context, id string) error {
	if _, err := a.ns.RevokeKey(ctx, &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		return fmt.Errorf("delayd revoke key %s: %w", id, err)
	}
	return nil
}

// Caller is what WhoAmI answers: the key a request was sent with.
type Caller struct {
	// Key is the caller's key ("admin-key" for the bootstrap key; empty ID
	// when authentication is off).
	Key Key `json:"key"`
	// AuthEnabled is false when the server lets every caller do everything.
	AuthEnabled bool `json:"auth_enabled"`
}

// WhoAmI describes the API key the client sends.
func (a *Admin) WhoAmI(ctx context.Context) (Caller, error) {
	resp, err := a.ns.WhoAmI(ctx, &delaydv1.WhoAmIRequest{})
	if err != nil {
		return Caller{}, fmt.Errorf("delayd whoami: %w", err)
	}
	return Caller{Key: keyFromProto(resp.GetKey()), AuthEnabled: resp.GetAuthEnabled()}, nil
}

// Watched is a copy of one delivery, from [Admin.Watch].
type Watched struct {
	// Task as delivered: state delivered, Attempt counting this delivery.
	Task Task
	// LeaseDeadline is when the delivery's lease ends.
	LeaseDeadline time.Time
	// DeliveryTime is when the server sent the delivery.
	DeliveryTime time.Time
	// Missed counts copies the watch missed (it read too slowly) before
	// this one.
	Missed int64
}

// WatchOptions tune [Admin.Watch].
type WatchOptions struct {
	// Ready, if set, is called once the server has registered the watch:
	// every delivery after that is seen.
	Ready func()
}

// Watch calls fn with a copy of each delivery the connected server makes in
// ns, without taking any: subscribers still receive every task. It needs the
// consume or admin scope. It returns when ctx ends (nil), when fn returns an
// error (that error), or when the stream fails (the status error). It does
// not reconnect.
func (a *Admin) Watch(ctx context.Context, ns string, opts WatchOptions, fn func(Watched) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.dlv.WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: ns})
	if err != nil {
		return fmt.Errorf("delayd watch %s: %w", ns, err)
	}
	md, err := stream.Header()
	if err == nil && md == nil {
		_, err = stream.Recv() // Ended before it was registered: its status.
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("delayd watch %s: %w", ns, err)
	}
	if opts.Ready != nil {
		opts.Ready()
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("delayd watch %s: %w", ns, err)
		}
		w := Watched{
			Task:          taskFromProto(resp.GetTask()),
			LeaseDeadline: timeFromProto(resp.GetLeaseDeadline()),
			DeliveryTime:  timeFromProto(resp.GetDeliveryTime()),
			Missed:        resp.GetMissed(),
		}
		if err := fn(w); err != nil {
			return err
		}
	}
}
