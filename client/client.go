package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Defaults used when an Option does not say otherwise.
const (
	// DefaultTimeout bounds every unary call (all its retries included).
	DefaultTimeout = 5 * time.Second
)

// DefaultRetryPolicy returns the retry policy a Client has unless
// [WithRetry] replaces it: up to 4 attempts, waiting a random time up to
// 100 ms, 200 ms, 400 ms (capped at 2 s) between them, for calls that fail
// with Unavailable.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		MaxAttempts:    4,
		InitialBackoff: 100 * time.Millisecond,
		MaxBackoff:     2 * time.Second,
		Multiplier:     2,
	}
}

// RetryPolicy says how a unary call that failed with codes.Unavailable is
// retried. delayd answers Unavailable only when a backing store is
// unreachable or the server is shutting down, and every retried RPC is safe
// to repeat (UpsertTask, BatchUpsertTasks and RemoveTask are idempotent by
// (namespace, id); GetTask and ListTasks read; AckTasks, NackTasks and
// ExtendLease answer per token). No other code is retried.
//
// Retries are done by grpc itself (its retry service config): attempt n+1
// starts after a random delay in [0, min(MaxBackoff, InitialBackoff *
// Multiplier^(n-1))), and all attempts together stay within the call's
// timeout.
type RetryPolicy struct {
	// MaxAttempts is the most attempts per call, the first one included. 0 or
	// 1 turns retries off.
	MaxAttempts int
	// InitialBackoff is the upper bound of the first random wait. If zero,
	// 100 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait bound. If zero, 2 s.
	MaxBackoff time.Duration
	// Multiplier grows the wait bound after each attempt. If zero, 2.
	Multiplier float64
}

// Option configures a Client.
type Option func(*options)

type options struct {
	apiKey     string
	creds      credentials.TransportCredentials
	timeout    time.Duration
	retry      RetryPolicy
	logger     *slog.Logger
	dialOpts   []grpc.DialOption
	maxBackoff time.Duration
	tracer     trace.TracerProvider
	batch      BatchSettings
}

// WithTracerProvider traces the client's calls with tp (OpenTelemetry;
// the W3C trace context travels to delayd, which keeps an upsert's with its
// task) and is where Consume starts each handler's span, linked to the
// producer's span. If not given, the global provider (otel.SetTracerProvider,
// which an application configures from its OTEL_* environment) is used;
// while that is the default no-op provider, nothing is traced.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

// WithAPIKey sends key as "authorization: Bearer <key>" metadata on every
// call. It is sent over plaintext connections too, so use [WithTLS] for a
// server outside a trusted network.
func WithAPIKey(key string) Option {
	return func(o *options) { o.apiKey = key }
}

// WithTLS connects over TLS with cfg (nil: the system roots, no client
// certificate). Give cfg.Certificates for mTLS. The default is plaintext.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.creds = credentials.NewTLS(cfg)
	}
}

// WithTransportCredentials connects with creds (TLS, ALTS, ...). It replaces
// [WithTLS].
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithTimeout bounds every unary call, its retries included, by d (the
// context's own deadline still applies when it is sooner). If unset, 5 s
// ([DefaultTimeout]); 0 or less means no bound but the context's. The
// consumer's Subscribe stream is never bounded by it.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithRetry replaces [DefaultRetryPolicy]. RetryPolicy{MaxAttempts: 1}
// turns retries off.
func WithRetry(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithLogger sets where the consumer logs failures to subscribe,
// reconnects, lost leases and handler panics. If unset, slog.Default() (read
// when New is called); pass slog.New(slog.DiscardHandler) to discard them.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithReconnectMaxDelay caps how long the connection waits between attempts
// to reach a server that is down. If unset, 5 s (grpc's own default is 2
// minutes, too long for a service whose server restarts in seconds).
func WithReconnectMaxDelay(d time.Duration) Option {
	return func(o *options) { o.maxBackoff = d }
}

// WithDialOptions adds raw grpc dial options (interceptors, keepalive,
// a custom dialer...). They are applied after the Client's own, so they win
// where both set the same thing.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// The Client's flow-control windows (see New).
const (
	windowStream = 4 << 20
	windowConn   = 16 << 20
)

// Client talks to one delayd endpoint: TaskService for producers and
// DeliveryService for consumers. It is safe for concurrent use; create one
// per process and Close it at exit.
type Client struct {
	conn     *grpc.ClientConn
	tasks    delaydv1.TaskServiceClient
	delivery delaydv1.DeliveryServiceClient
	opts     options
	pub      *publisher // nil when batching is disabled
}

// New returns a Client for target, a grpc target such as "localhost:7070" or
// "dns:///delayd.internal:7070". It does not connect: the connection is made
// by the first call and re-made whenever it breaks. An error means an option
// is invalid.
func New(target string, opts ...Option) (*Client, error) {
	o := options{
		timeout:    DefaultTimeout,
		retry:      DefaultRetryPolicy(),
		maxBackoff: 5 * time.Second,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.creds == nil {
		o.creds = insecure.NewCredentials()
	}
	if o.tracer == nil {
		o.tracer = otel.GetTracerProvider()
	}
	sc, err := serviceConfig(o.timeout, o.retry)
	if err != nil {
		return nil, err
	}
	bo := backoff.DefaultConfig
	if o.maxBackoff > 0 {
		bo.MaxDelay = o.maxBackoff
		if bo.BaseDelay > bo.MaxDelay {
			bo.BaseDelay = bo.MaxDelay
		}
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(o.creds),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(o.tracer), otelgrpc.WithPropagators(propagator))),
		// Fixed flow-control windows turn off grpc's BDP estimation, which
		// pings delayd after nearly every message received on an idle
		// connection: at a steady trickle of deliveries, a read and a write
		// of delayd's per message for nothing (TestClientSendsNoPings). A
		// stream may hold windowStream bytes unread: four full
		// StreamDeliveries responses (StreamBatchBytes, 1 MiB).
		grpc.WithInitialWindowSize(windowStream),
		grpc.WithInitialConnWindowSize(windowConn),
	}
	if o.retry.MaxAttempts > 5 {
		dial = append(dial, grpc.WithMaxCallAttempts(o.retry.MaxAttempts))
	}
	if o.apiKey != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: "Bearer " + o.apiKey}))
	}
	dial = append(dial, o.dialOpts...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("delayd client: %w", err)
	}
	c := &Client{
		conn:     conn,
		tasks:    delaydv1.NewTaskServiceClient(conn),
		delivery: delaydv1.NewDeliveryServiceClient(conn),
		opts:     o,
	}
	if !o.batch.Disabled {
		c.pub = newPublisher(c.tasks, o.batch)
	}
	return c, nil
}

// Conn returns the underlying connection, e.g. for
// delaydv1.NewNamespaceServiceClient. Its unary calls get the Client's
// timeout; only TaskService and the DeliveryService verdict calls are
// retried.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// ConnState is the connection's state: connectivity.Ready when delayd answers;
// Connecting, TransientFailure (the last attempt failed: a wrong address, a
// refused connection, a failed TLS handshake) or Idle otherwise. A Consume
// that cannot subscribe also reports each failure to its logger and
// ConsumeOptions.OnError.
func (c *Client) ConnState() connectivity.State { return c.conn.GetState() }

// Flush sends the Upsert and Remove calls the batcher holds now, without
// waiting for [BatchSettings].Linger, and waits until every call made before
// Flush was answered, or ctx ends. Calls block until answered anyway, so
// Flush is for a linger that should not hold a shutdown.
func (c *Client) Flush(ctx context.Context) error {
	if c.pub == nil {
		return nil
	}
	return c.pub.flush(ctx)
}

// Close refuses new Upsert and Remove calls ([ErrClosed]), lets the ones the
// batcher holds or has in flight finish (Flush, for at most the Client's
// timeout, 5 s by default), then closes the connection. Calls still in
// progress then fail with Canceled; a Consume still running ends with an
// error.
func (c *Client) Close() error {
	if c.pub != nil {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if c.opts.timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, c.opts.timeout)
		}
		_ = c.pub.close(ctx)
		cancel()
	}
	return c.conn.Close()
}

// bearer sends an API key as per-RPC credentials.
type bearer struct{ token string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": b.token}, nil
}

// RequireTransportSecurity is false so that plaintext loopback and
// in-cluster setups work; WithAPIKey documents the risk.
func (b bearer) RequireTransportSecurity() bool { return false }

// Service config shapes (grpc's JSON form). Only the fields used here.
type (
	scName struct {
		Service string `json:"service"`
		Method  string `json:"method,omitempty"`
	}
	scRetry struct {
		MaxAttempts          int      `json:"maxAttempts"`
		InitialBackoff       string   `json:"initialBackoff"`
		MaxBackoff           string   `json:"maxBackoff"`
		BackoffMultiplier    float64  `json:"backoffMultiplier"`
		RetryableStatusCodes []string `json:"retryableStatusCodes"`
	}
	scMethod struct {
		Name        []scName `json:"name"`
		Timeout     string   `json:"timeout,omitempty"`
		RetryPolicy *scRetry `json:"retryPolicy,omitempty"`
	}
	scConfig struct {
		MethodConfig []scMethod `json:"methodConfig"`
	}
)

// serviceConfig builds the grpc service config that carries the per-call
// timeout and the retry policy. Subscribe is named in neither: a stream has
// no deadline and its reconnects are Consume's business.
func serviceConfig(timeout time.Duration, p RetryPolicy) (string, error) {
	if p.MaxAttempts < 0 || p.InitialBackoff < 0 || p.MaxBackoff < 0 || p.Multiplier < 0 {
		return "", errors.New("delayd client: RetryPolicy fields must not be negative")
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = 2 * time.Second
	}
	if p.MaxBackoff < p.InitialBackoff {
		p.MaxBackoff = p.InitialBackoff
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	var to string
	if timeout > 0 {
		to = seconds(timeout)
	}
	retried := scMethod{
		Name: []scName{
			{Service: "delayd.v1.TaskService"},
			{Service: "delayd.v1.DeliveryService", Method: "AckTasks"},
			{Service: "delayd.v1.DeliveryService", Method: "NackTasks"},
			{Service: "delayd.v1.DeliveryService", Method: "ExtendLease"},
			// Schedules: reads, and pause and resume (a second pause or
			// resume changes nothing).
			{Service: "delayd.v1.ScheduleService", Method: "GetSchedule"},
			{Service: "delayd.v1.ScheduleService", Method: "ListSchedules"},
			{Service: "delayd.v1.ScheduleService", Method: "PreviewSchedule"},
			{Service: "delayd.v1.ScheduleService", Method: "PauseSchedule"},
			{Service: "delayd.v1.ScheduleService", Method: "ResumeSchedule"},
		},
		Timeout: to,
	}
	if p.MaxAttempts > 1 {
		retried.RetryPolicy = &scRetry{
			MaxAttempts:          p.MaxAttempts,
			InitialBackoff:       seconds(p.InitialBackoff),
			MaxBackoff:           seconds(p.MaxBackoff),
			BackoffMultiplier:    p.Multiplier,
			RetryableStatusCodes: []string{"UNAVAILABLE"},
		}
	}
	cfg := scConfig{MethodConfig: []scMethod{retried}}
	if to != "" {
		cfg.MethodConfig = append(cfg.MethodConfig, scMethod{
			Name: []scName{{Service: "delayd.v1.NamespaceService"},
				{Service: "delayd.v1.ScheduleService", Method: "CreateSchedule"},
				{Service: "delayd.v1.ScheduleService", Method: "UpdateSchedule"},
				{Service: "delayd.v1.ScheduleService", Method: "DeleteSchedule"}},
			Timeout: to,
		})
	}
	b, err := json.Marshal(cfg)
	return string(b), err
}

// seconds formats d as a service config duration ("0.100000000s").
func seconds(d time.Duration) string {
	return fmt.Sprintf("%d.%09ds", d/time.Second, d%time.Second)
}

// propagator carries the W3C trace context (and baggage) on the wire.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
