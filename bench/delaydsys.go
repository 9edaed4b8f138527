package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/delayd/delayd/bench/baseline"
	"github.com/delayd/delayd/client"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// delaydConfig configures the gRPC driver of a delayd.
type delaydConfig struct {
	// Addr is the delayd to drive, host:port.
	Addr string
	// APIKey, if set, is sent as "authorization: Bearer <key>".
	APIKey string
	// Conns is how many gRPC connections producers and subscribers share,
	// round-robin. If zero, 4.
	Conns int
	// AckBatch is the most tokens per AckTasks call. If zero, 500.
	AckBatch int
	// AckLinger is how long an acker waits for more tokens before it sends
	// a batch that is not full. If zero, 1 ms.
	AckLinger time.Duration
	// AckConcurrency is the most AckTasks calls in flight per subscriber.
	// If zero, 4.
	AckConcurrency int
	// CPU measures the delayd process; nil if it cannot be measured.
	CPU func() (time.Duration, string, bool)
	// PID is the delayd process (this one for an in-process delayd); 0 if
	// unknown.
	PID int
	// Redis is the Redis delayd uses, for cleanup; nil skips key cleanup.
	Redis redis.UniversalClient
	// Shards is the shard count of the namespaces setup creates; 0 = the
	// server default.
	Shards int
	// HistoryBytes is the history_retention_bytes of the namespaces setup
	// creates; 0 = no history.
	HistoryBytes int64
	// SDK sends unary upserts through the Go SDK's Client.Upsert (with its
	// default batching) instead of the raw UpsertTask stub, and receives
	// as the SDK does: StreamDeliveries, acks on the stream, over the
	// SDK Client's own connection (its dial settings: one connection,
	// fixed flow-control windows).
	SDK bool
	// FixedWindows fixes the raw connections' flow-control windows
	// (Config.FixedWindows).
	FixedWindows bool
	// SDKMaxOutstanding is the SDK's BatchSettings.MaxOutstanding; 0 =
	// its default.
	SDKMaxOutstanding int
	// MySQL sizes the durable database (durable mode); nil otherwise.
	MySQL *mysqlSizer
	// Label names the system in reports. If empty, "delayd".
	Label  string
	Logger *slog.Logger
}

// delaydSystem drives a delayd through the raw gRPC stubs.
type delaydSystem struct {
	cfg        delaydConfig
	conns      []*grpc.ClientConn
	tasks      []delaydv1.TaskServiceClient
	delivery   []delaydv1.DeliveryServiceClient
	admin      delaydv1.NamespaceServiceClient
	sdk        *client.Client // with cfg.SDK
	rr         atomic.Uint64
	streamErrs atomic.Int64
}

// bearer sends an API key with every call; the benchmark talks plaintext
// gRPC over loopback, so it does not insist on transport security.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// newDelaydSystem dials cfg.Addr.
func newDelaydSystem(cfg delaydConfig) (*delaydSystem, error) {
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	if cfg.AckBatch <= 0 {
		cfg.AckBatch = 500
	}
	if cfg.AckLinger <= 0 {
		cfg.AckLinger = time.Millisecond
	}
	if cfg.AckConcurrency <= 0 {
		cfg.AckConcurrency = 4
	}
	if cfg.Label == "" {
		cfg.Label = "delayd"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256 << 20)),
	}
	if cfg.APIKey != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(cfg.APIKey)))
	}
	if cfg.FixedWindows {
		opts = append(opts, grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(16<<20))
	}
	s := &delaydSystem{cfg: cfg}
	for range cfg.Conns {
		cc, err := grpc.NewClient(cfg.Addr, opts...)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("dial delayd %s: %w", cfg.Addr, err)
		}
		s.conns = append(s.conns, cc)
		s.tasks = append(s.tasks, delaydv1.NewTaskServiceClient(cc))
		s.delivery = append(s.delivery, delaydv1.NewDeliveryServiceClient(cc))
	}
	s.admin = delaydv1.NewNamespaceServiceClient(s.conns[0])
	if cfg.SDK {
		// One Client, as an application has: its batcher coalesces the
		// calls of every producer goroutine.
		copts := []client.Option{client.WithLogger(cfg.Logger),
			client.WithBatching(client.BatchSettings{MaxOutstanding: cfg.SDKMaxOutstanding})}
		if cfg.APIKey != "" {
			copts = append(copts, client.WithAPIKey(cfg.APIKey))
		}
		c, err := client.New(cfg.Addr, copts...)
		if err != nil {
			s.close()
			return nil, err
		}
		s.sdk = c
	}
	return s, nil
}

// close closes the connections.
func (s *delaydSystem) close() {
	if s.sdk != nil {
		_ = s.sdk.Close()
	}
	for _, cc := range s.conns {
		_ = cc.Close()
	}
}

func (s *delaydSystem) name() string { return s.cfg.Label }

// next picks a connection round-robin.
func (s *delaydSystem) next() int { return int(s.rr.Add(1) % uint64(len(s.conns))) }

// setup creates the namespaces where the server keeps a registry; a server
// that auto-creates namespaces (or has no admin API yet) needs nothing.
func (s *delaydSystem) setup(ctx context.Context, nss []string) error {
	for _, ns := range nss {
		_, err := s.admin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns,
			Policy: &delaydv1.NamespacePolicy{Shards: int32(s.cfg.Shards), HistoryRetentionBytes: s.cfg.HistoryBytes}}})
		switch status.Code(err) {
		case codes.OK, codes.AlreadyExists, codes.Unimplemented:
		case codes.PermissionDenied, codes.Unauthenticated:
			// Maybe auto-create is on and the key may only produce and
			// consume: the first upsert will tell.
		default:
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	return nil
}

func (s *delaydSystem) upsert(ctx context.Context, ns string, items []item, payload []byte, unary bool) error {
	if unary && s.sdk != nil {
		for _, it := range items {
			if _, err := s.sdk.Upsert(ctx, ns, client.TaskSpec{ID: it.id, Payload: payload, When: client.At(it.due)}); err != nil {
				return err
			}
		}
		return nil
	}
	c := s.tasks[s.next()]
	if unary {
		for _, it := range items {
			_, err := c.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{
				Namespace: ns, Id: it.id, Payload: payload,
				When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(it.due)},
			})
			if err != nil {
				return fmt.Errorf("UpsertTask: %w", err)
			}
		}
		return nil
	}
	req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: make([]*delaydv1.UpsertTaskRequest, len(items))}
	for i, it := range items {
		req.Tasks[i] = &delaydv1.UpsertTaskRequest{
			Id: it.id, Payload: payload,
			When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(it.due)},
		}
	}
	resp, err := c.BatchUpsertTasks(ctx, req)
	if err != nil {
		return fmt.Errorf("BatchUpsertTasks: %w", err)
	}
	for i, r := range resp.GetResults() {
		if e := r.GetError(); e != nil {
			return fmt.Errorf("BatchUpsertTasks item %s: code %d: %s", items[i].id, e.GetCode(), e.GetMessage())
		}
	}
	if len(resp.GetResults()) != len(items) {
		return fmt.Errorf("BatchUpsertTasks: %d results for %d items", len(resp.GetResults()), len(items))
	}
	return nil
}

// consume opens subscribers Subscribe streams spread over nss (at least
// one per namespace). Each stream has one receiver and one acker goroutine;
// the acker sends batches of up to AckBatch tokens, at most AckConcurrency
// calls at once. A stream that breaks is reopened after 100 ms and counted.
func (s *delaydSystem) consume(ctx context.Context, nss []string, subscribers, maxInFlight int, sk sink) (func(), error) {
	if subscribers < len(nss) {
		subscribers = len(nss)
	}
	if maxInFlight <= 0 {
		maxInFlight = 64
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range subscribers {
		ns := nss[i%len(nss)]
		ci := s.next()
		if s.cfg.SDK {
			// The SDK's delivery path: StreamDeliveries, acks on the stream,
			// on the SDK's connection.
			sdk := delaydv1.NewDeliveryServiceClient(s.sdk.Conn())
			wg.Go(func() { s.receiveStream(ctx, sdk, ns, maxInFlight, sk) })
			continue
		}
		tokens := make(chan string, maxInFlight)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer close(tokens)
			s.receive(ctx, s.delivery[ci], ns, maxInFlight, sk, tokens)
		}()
		go func() {
			defer wg.Done()
			s.ackLoop(ctx, s.delivery[ci], ns, sk, tokens)
		}()
	}
	return func() { cancel(); wg.Wait() }, nil
}

// receive reads one subscriber's deliveries until ctx ends.
func (s *delaydSystem) receive(ctx context.Context, c delaydv1.DeliveryServiceClient, ns string, maxInFlight int, sk sink, tokens chan<- string) {
	for ctx.Err() == nil {
		stream, err := c.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: int32(maxInFlight)})
		if err == nil {
			for {
				resp, rerr := stream.Recv()
				if rerr != nil {
					err = rerr
					break
				}
				d := resp.GetDelivery()
				sk.delivered(ns, d.GetTask().GetId(), time.Now())
				select {
				case tokens <- d.GetToken():
				case <-ctx.Done():
					return
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		s.streamErrs.Add(1)
		s.cfg.Logger.Warn("subscribe stream ended; reopening", "namespace", ns, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// receiveStream is one StreamDeliveries subscriber (the SDK's path: several
// deliveries per message, acks batched as ackLoop's and sent on the same
// stream, answered on it) until ctx ends; a stream that breaks is reopened
// after 100 ms and counted.
func (s *delaydSystem) receiveStream(ctx context.Context, c delaydv1.DeliveryServiceClient, ns string, maxInFlight int, sk sink) {
	for ctx.Err() == nil {
		err := s.streamOnce(ctx, c, ns, maxInFlight, sk)
		if ctx.Err() != nil {
			return
		}
		s.streamErrs.Add(1)
		s.cfg.Logger.Warn("delivery stream ended; reopening", "namespace", ns, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *delaydSystem) streamOnce(ctx context.Context, c delaydv1.DeliveryServiceClient, ns string, maxInFlight int, sk sink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.StreamDeliveries(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&delaydv1.StreamDeliveriesRequest{Namespace: ns, MaxInFlight: int32(maxInFlight),
		MaxBatch: int32(min(maxInFlight, 1000))}); err != nil {
		return err
	}
	tokens := make(chan string, maxInFlight)
	sent := make(chan struct{})
	go func() { // the stream's only sender after the opening request
		defer close(sent)
		linger := time.NewTimer(time.Hour)
		defer linger.Stop()
		for {
			var tok string
			select {
			case tok = <-tokens:
			case <-ctx.Done():
				return
			}
			batch := []string{tok}
			linger.Reset(s.cfg.AckLinger)
		fill:
			for len(batch) < s.cfg.AckBatch {
				select {
				case t := <-tokens:
					batch = append(batch, t)
				case <-linger.C:
					break fill
				case <-ctx.Done():
					return
				}
			}
			if err := stream.Send(&delaydv1.StreamDeliveriesRequest{AckTokens: batch}); err != nil {
				return
			}
		}
	}()
	defer func() { cancel(); <-sent }()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		if rs := resp.GetAckResults(); len(rs) > 0 {
			okN := 0
			for _, r := range rs {
				if r.GetStatus() == delaydv1.TokenStatus_TOKEN_STATUS_OK {
					okN++
				}
			}
			sk.acked(okN, len(rs)-okN, time.Now())
		}
		now := time.Now()
		for _, d := range resp.GetDeliveries() {
			sk.delivered(ns, d.GetTask().GetId(), now)
			select {
			case tokens <- d.GetToken():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// ackLoop batches tokens into AckTasks calls until tokens is closed.
func (s *delaydSystem) ackLoop(ctx context.Context, c delaydv1.DeliveryServiceClient, ns string, sk sink, tokens <-chan string) {
	sem := make(chan struct{}, s.cfg.AckConcurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	for {
		tok, ok := <-tokens
		if !ok {
			return
		}
		batch := []string{tok}
		linger.Reset(s.cfg.AckLinger)
	fill:
		for len(batch) < s.cfg.AckBatch {
			select {
			case t, ok := <-tokens:
				if !ok {
					break fill
				}
				batch = append(batch, t)
			case <-linger.C:
				break fill
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(batch []string) {
			defer func() { <-sem; wg.Done() }()
			resp, err := c.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: batch})
			now := time.Now()
			if err != nil {
				if ctx.Err() == nil {
					s.cfg.Logger.Warn("AckTasks failed", "namespace", ns, "tokens", len(batch), "err", err)
					sk.acked(0, len(batch), now)
				}
				return
			}
			okN := 0
			for _, r := range resp.GetResults() {
				if r.GetStatus() == delaydv1.TokenStatus_TOKEN_STATUS_OK {
					okN++
				}
			}
			sk.acked(okN, len(batch)-okN, now)
		}(batch)
	}
}

func (s *delaydSystem) cpu() (time.Duration, string, bool) {
	if s.cfg.CPU == nil {
		return 0, "", false
	}
	return s.cfg.CPU()
}

func (s *delaydSystem) pid() int { return s.cfg.PID }

// cleanup deletes the namespaces (where the server has an admin API) and
// then every Redis key that names one of them. Namespace names carry the
// run's random suffix, so the pattern cannot match anyone else's keys.
func (s *delaydSystem) cleanup(ctx context.Context, nss []string) error {
	var errs []error
	for _, ns := range nss {
		_, err := s.admin.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true})
		switch status.Code(err) {
		case codes.OK, codes.NotFound, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		default:
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", ns, err))
		}
		if s.cfg.Redis != nil {
			if _, err := baseline.DeleteMatching(ctx, s.cfg.Redis, "*"+ns+"*"); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// mysqlSizesOrNil reads the durable database's table sizes; ok is false
// in Redis-only mode, on a nil d (another system) or when the read failed
// (logged as a warning).
func (d *delaydSystem) mysqlSizesOrNil(ctx context.Context) (tableBytes, bool) {
	if d == nil || d.cfg.MySQL == nil {
		return nil, false
	}
	t, err := d.cfg.MySQL.sizes(ctx)
	if err != nil {
		if d.cfg.Logger != nil {
			d.cfg.Logger.Warn("mysql bytes not measured", "err", err)
		}
		return nil, false
	}
	return t, true
}
