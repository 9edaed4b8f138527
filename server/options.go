package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
)

// History is what the server asks of the store for task histories and
// forecasts: GetTaskHistory reads the events (which the history package's
// store decorator records), GetNamespaceStats the forecast.
type History interface {
	storage.History
	storage.Forecaster
}

// Recent is what the server asks about a namespace's recent deliveries on
// this replica. *history.Recent implements it.
type Recent interface {
	// Deliveries reports the recent deliveries of incarnation incarnation
	// of ns (storage.Namespace.Incarnation): none of an earlier one.
	Deliveries(ns string, incarnation int64) storage.RecentDeliveries
}

// Tenancy is namespaces and keys as the server and its guard read them
// (guard.Tenancy: the registry, its cached lookups, the policy defaults).
type Tenancy = guard.Tenancy

// Subscriptions is what the server asks of the dispatcher: serve a Subscribe
// stream, and hear about what the RPCs did to deliveries and due times.
// *dispatcher.Dispatcher implements it.
type Subscriptions interface {
	// Serve delivers ns's due tasks to sub until ctx ends or the dispatcher
	// stops (dispatcher.ErrStopped).
	Serve(ctx context.Context, sub dispatcher.Subscriber) error
	// Notify says that ns may have a new earliest due task.
	Notify(ns string)
	// Settle returns the credit of acked or nacked deliveries, on every
	// replica: settled[i] says the store settled tokens[i] (those are
	// announced to the replica whose stream holds them).
	Settle(ctx context.Context, ns string, tokens []storage.Token, settled []bool)
	// LeaseExtended moves the local lease estimate of the deliveries by by.
	LeaseExtended(ns string, tokens []storage.Token, by time.Duration)
	// PolicyChanged says ns's policy was changed here: every replica's
	// dispatcher applies it at once (pause, resume).
	PolicyChanged(ctx context.Context, ns string)
	// Watch sends w a copy of each delivery of w.Namespace until ctx ends
	// or the dispatcher stops (dispatcher.ErrStopped), taking nothing.
	Watch(ctx context.Context, w dispatcher.Watcher) error
}

var _ Subscriptions = (*dispatcher.Dispatcher)(nil)

// PushAllow decides which push URLs a namespace may set.
type PushAllow interface {
	// Enabled reports whether push is on at all.
	Enabled() bool
	// CheckURL returns nil when raw may be a push target; otherwise an
	// error, written for the client, saying why and what is allowed.
	CheckURL(ctx context.Context, raw string) error
}

// Options are the parts and limits a Server is built from.
type Options struct {
	// Logger for request logs and errors. If nil, logs are discarded.
	Logger *slog.Logger
	// CallLog configures the request log (quiet at INFO by default).
	CallLog CallLog

	// Store backs every task, delivery, dead-letter and stats RPC. Required.
	Store storage.Store
	// Tenancy answers each namespace's policy (ack timeout, payload limit,
	// horizon...), stores namespaces and API keys for NamespaceService, and
	// looks keys up for authentication. Required; pass a *tenancy.Registry.
	Tenancy Tenancy
	// Subscriptions serves Subscribe streams and is told about upserts that
	// put an earlier task at the head of a namespace. Required; pass the
	// *dispatcher.Dispatcher.
	Subscriptions Subscriptions
	// History reads task histories (GetTaskHistory) and the due forecast
	// of GetNamespaceStats. Required; pass the store that keeps the
	// history (redisstore, or the durable store).
	History History
	// Schedules runs the ScheduleService operations (recurring tasks).
	// Required; pass the *schedule.Scheduler.
	Schedules Schedules
	// Recent, if set, answers what this replica delivered lately per
	// namespace (GetNamespaceStats' recent rate and lateness
	// percentiles); nil leaves those fields unset. Pass the
	// *history.Recent the history decorator feeds.
	Recent Recent

	// Limits bound what one request may ask for.
	Limits Limits
	// SharedLimits, if set, counts each namespace's request rate
	// (policy.rate_limit) and Subscribe streams (policy.max_subscribers)
	// once for every replica (the daemon passes the Redis store). If nil,
	// or while it fails, each replica counts its own.
	SharedLimits storage.SharedLimits

	// Clock reads local time: relative due times sent as timestamps,
	// quota count ages, API key create times. If nil, the system clock.
	// (Due-ness is decided by the store's clock, never this one.)
	Clock storage.Clock

	// Reflection registers gRPC server reflection (for grpcurl). Default
	// off: it needs no API key (see guard's open methods).
	Reflection bool

	// Instrumentation are extra gRPC server options for observability (the
	// Prometheus interceptors, the OpenTelemetry stats handler). They are
	// applied before the server's own, so the interceptors they chain run
	// outermost and see every call, including those refused by auth or
	// limits.
	Instrumentation []grpc.ServerOption

	// Auth configures API-key authentication; see AuthOptions for when it
	// is on. ResolveAuth builds it from the daemon's flags.
	Auth guard.AuthOptions
	// PushAllow, if set and enabled, is the operator's list of HTTP push
	// destinations: a namespace policy may set push only to a URL it
	// admits (*push.Allow implements it). If nil or empty, push is
	// disabled: a policy that sets push is refused.
	PushAllow PushAllow

	// TLS, if non-nil, makes the listener speak TLS with this configuration
	// (mTLS when it requires client certificates); LoadTLSConfig builds it
	// from PEM files. If nil, plaintext.
	TLS *tls.Config
}

// Limits bound requests. Zero fields take the defaults given.
type Limits struct {
	// MaxBatch is the most items in one BatchUpsertTasks, AckTasks,
	// NackTasks or ExtendLease call. If zero, 1,000.
	MaxBatch int
	// MaxMessageBytes is the largest gRPC message received or sent. If
	// zero, 5 MiB: what the largest legal batch needs (1,000 items whose
	// payloads total at most MaxBatchPayloadBytes, plus ids, kinds and times).
	MaxMessageBytes int
	// MaxBatchPayloadBytes is the most payload bytes one BatchUpsertTasks
	// may carry in total (its reply carries them back). If zero, 4 MiB: one
	// task of the largest payload a namespace may allow.
	MaxBatchPayloadBytes int
	// MaxConnections is the most client connections the server holds
	// open; a connection accepted beyond it is closed at once. If zero,
	// 10,000.
	MaxConnections int
	// MaxConnectionIdle is how long a connection with no call in progress
	// stays open before the server sends it GOAWAY (clients reconnect
	// transparently). If zero, 5 minutes.
	MaxConnectionIdle time.Duration
	// IdlePerPeer is how many idle connections (no call in progress) one
	// peer — an IPv4 address or an IPv6 /64 — keeps for
	// MaxConnectionIdle, on each listener: its idle connections beyond
	// it are closed after CrowdedIdleTimeout, and go first when the
	// listener is full. If zero, MaxConnections/16, at least 4.
	IdlePerPeer int
	// CrowdedIdleTimeout is how long the idle connections of a peer over
	// IdlePerPeer stay open. If zero, 10 seconds.
	CrowdedIdleTimeout time.Duration
	// MaxConcurrentStreams per connection. If zero, 1,000.
	MaxConcurrentStreams uint32
	// MaxKeylessStreamsPerConn is the most streams of the methods that
	// need no API key (health Watch, server reflection) one connection
	// holds open; one more is refused ResourceExhausted. If zero, 4.
	MaxKeylessStreamsPerConn int
	// MaxKeylessStreamsPerPeer is the most such streams one peer (an IPv4
	// address or an IPv6 /64) holds open on one listener, over all its
	// connections. If zero, 32.
	MaxKeylessStreamsPerPeer int
	// KeylessStreamLifetime is how long such a stream may stay open: then
	// it ends with Unavailable and its client opens another (grpc-go's
	// client-side health checking does so at once). If zero, 10 minutes.
	KeylessStreamLifetime time.Duration
	// MaxInFlight is the largest max_in_flight a subscriber may ask for. If
	// zero, 10,000.
	MaxInFlight int
	// MaxStreamsPerKey is the most subscriber streams (Subscribe,
	// StreamDeliveries), and apart from them the most watches
	// (WatchDeliveries), one API key may hold
	// open on this server replica, across all namespaces (a namespace's
	// policy.max_subscribers bounds its streams on top). If zero, 100.
	MaxStreamsPerKey int
	// MaxKeys is the most API keys one namespace holds, and the most
	// global keys: CreateKey past it is ResourceExhausted naming the
	// limit. If zero, 100.
	MaxKeys int
	// DefaultInFlight is used when a subscriber asks for 0. If zero, 64.
	DefaultInFlight int
	// MaxListBytes bounds one page of ListTasks and ListDeadLetters by
	// bytes: a page ends before the task that would take it past this
	// many bytes (counted generously: payload, id, kind, last error, plus
	// 256 bytes a task), and goes on with next_page_token. A page's first
	// task is always sent. If zero, 1 MiB; at most half of MaxMessageBytes.
	MaxListBytes int
	// HTTPBodyTimeout is how long a client of the HTTP edge may take to
	// send a request's body, from its headers to its end (a 5 MiB body
	// needs 90 KB/s): a unary call whose body has not ended then is
	// answered 408 naming the limit, and a stream's call fails. If zero, 1
	// minute.
	HTTPBodyTimeout time.Duration
}
