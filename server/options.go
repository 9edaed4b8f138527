package server

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/storage"
)

// Options are the parts and limits a Server is built from.
type Options struct {
	// Logger for request logs and errors. If nil, logs are discarded.
	Logger *slog.Logger
	// CallLog configures the request log (quiet at INFO by default).
	CallLog CallLog

	// Tasks backs TaskService. Required.
	Tasks storage.Tasks
	// Deliveries backs DeliveryService's ack, nack and extend. Required.
	Deliveries storage.Deliveries
	// DeadLetters backs NamespaceService's dead-letter RPCs. Required.
	DeadLetters storage.DeadLetters
	// Counter backs GetNamespaceStats. Required.
	Counter storage.Counter
	// Policies answers each namespace's policy (ack timeout, payload limit,
	// horizon...). If nil, storage.DefaultPolicy for every namespace.
	Policies storage.Policies
	// Dispatcher serves Subscribe streams and is told about upserts that
	// put an earlier task at the head of a namespace. Required.
	Dispatcher *dispatcher.Dispatcher

	// Limits bound what one request may ask for.
	Limits Limits

	// DisableReflection turns off gRPC server reflection. Default: on.
	DisableReflection bool

	// Registry stores namespaces and API keys. NamespaceService's namespace
	// and key RPCs need it (without it they answer Unimplemented), and
	// authentication looks keys up in it. Pass a *tenancy.Registry: it
	// caches key lookups, and the same value serves as Policies.
	Registry storage.Registry
	// Auth configures API-key authentication; see AuthOptions for when it
	// is on. ResolveAuth builds it from the daemon's flags.
	Auth AuthOptions
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
	// MaxConcurrentStreams per connection. If zero, 1,000.
	MaxConcurrentStreams uint32
	// MaxInFlight is the largest max_in_flight a subscriber may ask for. If
	// zero, 10,000.
	MaxInFlight int
	// DefaultInFlight is used when a subscriber asks for 0. If zero, 64.
	DefaultInFlight int
}
