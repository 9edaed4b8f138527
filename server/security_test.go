package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage"
)

// The attacks of issue 11, each reproduced over real gRPC (or raw HTTP/2
// where grpc-go's own client would refuse to send the attack) against real
// Redis.

// h2Conn is a raw HTTP/2 client connection to a replica: the attacker's.
type h2Conn struct {
	t    *testing.T
	conn net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	next uint32 // next stream id
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(dlvWait))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{t: t, conn: conn, fr: http2.NewFramer(conn, conn), next: 1}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20
	c.enc = hpack.NewEncoder(&c.hbuf)
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// open starts a gRPC call to method with the given extra header fields and
// no body (the stream stays open). It returns the stream id.
func (c *h2Conn) open(method string, extra ...hpack.HeaderField) uint32 {
	c.t.Helper()
	c.hbuf.Reset()
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: method}, {Name: ":authority", Value: "delayd"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}
	for _, f := range append(fields, extra...) {
		if err := c.enc.WriteField(f); err != nil {
			c.t.Fatal(err)
		}
	}
	id := c.next
	c.next += 2
	block := c.hbuf.Bytes()
	const chunk = 16 << 10
	first := block[:min(len(block), chunk)]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) <= chunk}); err != nil {
		c.t.Fatal(err)
	}
	for rest := block[len(first):]; len(rest) > 0; {
		n := min(len(rest), chunk)
		if err := c.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			c.t.Fatal(err)
		}
		rest = rest[n:]
	}
	return id
}

// sync sends a PING and reads frames until its ack: the server has then
// processed every frame sent before it. It returns the grpc-status of each
// stream the server answered meanwhile.
func (c *h2Conn) sync() map[uint32]string {
	c.t.Helper()
	if err := c.fr.WritePing(false, [8]byte{7}); err != nil {
		c.t.Fatal(err)
	}
	answered := make(map[uint32]string)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading frames: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				return answered
			}
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				answered[f.StreamID] = "http " + v
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					answered[f.StreamID] = hf.Value
				}
			}
		case *http2.RSTStreamFrame:
			answered[f.StreamID] = "rst " + f.ErrCode.String()
		case *http2.GoAwayFrame:
			c.t.Fatalf("GOAWAY %v %q", f.ErrCode, f.DebugData())
		}
	}
}

// answers reads frames until the server answered n streams (grpc-status
// or RST_STREAM), and returns them; it fails the test when the connection
// ends or its deadline passes first.
func (c *h2Conn) answers(n int) map[uint32]string {
	c.t.Helper()
	answered := make(map[uint32]string)
	for len(answered) < n {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading frames with %d of %d streams answered: %v", len(answered), n, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					answered[f.StreamID] = hf.Value
				}
			}
		case *http2.RSTStreamFrame:
			if _, ok := answered[f.StreamID]; !ok {
				answered[f.StreamID] = "rst " + f.ErrCode.String()
			}
		}
	}
	return answered
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestHeaderFloodIsRefused reproduces the unauthenticated header flood:
// streams with no API key and HPACK-repeated "-bin" metadata (a few KB on
// the wire, megabytes decoded) and no body. The server must not hold that
// memory: the header list is capped at a few KiB and the streams refused.
// (Not parallel: it measures the process's heap.)
func TestHeaderFloodIsRefused(t *testing.T) {
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	c := dialH2(t, r.addr)
	c.sync()

	const streams, repeats = 16, 1500 // 16 × 1,500 × ~2.7 KB decoded ≈ 64 MB
	value := strings.Repeat("QUFB", 900)
	field := hpack.HeaderField{Name: "x-flood-bin", Value: value}
	before := heapInUse()
	for range streams {
		extra := make([]hpack.HeaderField, repeats)
		for i := range extra {
			extra[i] = field
		}
		c.open(delaydv1.TaskService_BatchUpsertTasks_FullMethodName, extra...)
	}
	answered := c.sync()
	grown := int64(heapInUse()) - int64(before)
	t.Logf("%d unauthenticated header-flood streams: heap %+d KiB, answered %d", streams, grown>>10, len(answered))
	if grown > 8<<20 {
		t.Errorf("the heap grew by %d MiB holding %d unauthenticated streams' headers; want the header list capped", grown>>20, streams)
	}
	if len(answered) != streams {
		t.Errorf("%d of %d flood streams were refused; want every one refused at once", len(answered), streams)
	}
}

// TestUnauthenticatedCallRefusedBeforeBody: a call to a delayd service with
// no API key, or a malformed one, is answered Unauthenticated as soon as its
// headers arrive, before the client sends any body; health stays open.
func TestUnauthenticatedCallRefusedBeforeBody(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	c := dialH2(t, r.addr)
	noKey := c.open(delaydv1.TaskService_BatchUpsertTasks_FullMethodName)
	badKey := c.open(delaydv1.DeliveryService_Subscribe_FullMethodName,
		hpack.HeaderField{Name: "authorization", Value: "Bearer not-a-key"})
	health := c.open("/grpc.health.v1.Health/Check")
	got := c.answers(2)
	for name, id := range map[string]uint32{"no key": noKey, "malformed key": badKey} {
		if got[id] != "16" {
			t.Errorf("%s: answered %q before the body was sent, want grpc-status 16 (Unauthenticated)", name, got[id])
		}
	}
	if st, ok := got[health]; ok {
		t.Errorf("health check was answered %q before its request body; want it left open (no key needed)", st)
	}

	// A real client with a well-formed key gets past the tap, and a real
	// client without one gets Unauthenticated.
	_, err := r.tasks.GetTask(context.Background(), &delaydv1.GetTaskRequest{Namespace: "x", Id: "y"})
	wantCode(t, err, codes.Unauthenticated, "missing API key")
}

// TestConnectionCapAndIdle: connections beyond Limits.MaxConnections are
// closed as soon as they are accepted, and a connection idle for
// Limits.MaxConnectionIdle is sent GOAWAY.
func TestConnectionCapAndIdle(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.Limits.MaxConnections = 2 // the replica's own client connection is not dialed yet
		o.Limits.MaxConnectionIdle = 300 * time.Millisecond
	}})
	a := dialH2(t, r.addr)
	a.sync()
	b := dialH2(t, r.addr)
	b.sync()
	// The third connection is closed as soon as it is accepted: writing
	// the preface or reading the server's first frame fails.
	over, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_ = over.SetDeadline(time.Now().Add(dlvWait))
	if _, err := io.WriteString(over, http2.ClientPreface); err == nil {
		if _, err := http2.NewFramer(over, over).ReadFrame(); err == nil {
			t.Errorf("a third connection over MaxConnections 2 was served")
		}
	}
	// a and b go idle: GOAWAY.
	for {
		f, err := a.fr.ReadFrame()
		if err != nil {
			t.Fatalf("idle connection ended without GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo {
				t.Errorf("idle GOAWAY code %v, want NO_ERROR", g.ErrCode)
			}
			break
		}
	}
}

// TestOverlongRepeatedFieldRefusedBeforeBuilding: a request whose repeated
// field has more items than a call may carry is refused with
// InvalidArgument naming the field, and malformed protobuf or invalid UTF-8
// answers InvalidArgument, not Internal.
func TestOverlongRepeatedFieldRefusedBeforeBuilding(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.Limits.MaxBatch = 10
		o.Limits.MaxBatchPayloadBytes = 1000
	}})
	ns := e.newNamespace(r, "codec-", nil)
	tokens := make([]string, 11)
	for i := range tokens {
		tokens[i] = "x"
	}
	_, err := r.dlv.AckTasks(admin(), &delaydv1.AckTasksRequest{Namespace: ns, Tokens: tokens})
	wantCode(t, err, codes.InvalidArgument, "tokens has more than 10 items")

	// Invalid UTF-8 in a string field, sent as raw bytes.
	var raw []byte
	raw = protowire.AppendTag(raw, 1, protowire.BytesType)
	raw = protowire.AppendString(raw, ns)
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte{'a', 0xff, 'b'})
	err = r.conn.Invoke(admin(), delaydv1.TaskService_GetTask_FullMethodName, rawMessage(raw), new(delaydv1.GetTaskResponse), grpc.ForceCodecV2(rawCodec{}))
	wantCode(t, err, codes.InvalidArgument, "UTF-8")

	// Truncated protobuf.
	err = r.conn.Invoke(admin(), delaydv1.TaskService_GetTask_FullMethodName, rawMessage([]byte{0x0a, 0x40, 'a'}), new(delaydv1.GetTaskResponse), grpc.ForceCodecV2(rawCodec{}))
	wantCode(t, err, codes.InvalidArgument, "not a valid delayd.v1.GetTaskRequest")

	// A batch's payloads are bounded in total, however few its items.
	_, err = r.tasks.BatchUpsertTasks(admin(), &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "a", Payload: make([]byte, 600), When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
		{Id: "b", Payload: make([]byte, 600), When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
	}})
	wantCode(t, err, codes.InvalidArgument, "1200 payload bytes in total")

	// Within the limits, the call goes through.
	if _, err := r.tasks.BatchUpsertTasks(admin(), &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "a", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
	}}); err != nil {
		t.Errorf("a legal batch: %v", err)
	}
}

// rawMessage is a request sent as the bytes given, through rawCodec: what
// an attacker's client sends.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// subscribeRecv opens a Subscribe stream on r with ctx and returns a channel
// of what it receives: deliveries, then the error it ended with.
func subscribeRecv(t *testing.T, ctx context.Context, r *tenReplica, ns string) (<-chan *delaydv1.Delivery, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, dlvWait)
	t.Cleanup(cancel)
	s, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Header(); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	dels, done := make(chan *delaydv1.Delivery, 100), make(chan error, 1)
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				done <- err
				return
			}
			dels <- resp.GetDelivery()
		}
	}()
	return dels, done
}

// TestRevokedKeyEndsStreams: a consume key's open Subscribe stream on
// another replica ends (Unauthenticated) within the cache lifetime after
// the key is revoked, and gets no task upserted after that.
func TestRevokedKeyEndsStreams(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r1, r2 := e.replica(tenOpts{}), e.replica(tenOpts{})
	ns := e.newNamespace(r1, "revoke-", nil)
	id, secret := e.newKey(r1, ns, delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	dels, done := subscribeRecv(t, as(secret), r2, ns)
	if err := upsertAs(admin(), r1, ns, "before"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dels:
	case err := <-done:
		t.Fatalf("stream ended before the revocation: %v", err)
	}
	if _, err := r1.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	err := <-done
	wantCode(t, err, codes.Unauthenticated, "revoked")
	if err := upsertAs(admin(), r1, ns, "after"); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-dels:
		t.Errorf("a revoked key's stream received %q", d.GetTask().GetId())
	default:
	}
}

// TestDeletedNamespaceEndsStreams: a stream of a namespace that is
// force-deleted and re-created by someone else ends, on every replica, and
// never receives the new namespace's tasks.
func TestDeletedNamespaceEndsStreams(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r1, r2 := e.replica(tenOpts{}), e.replica(tenOpts{})
	ns := e.newNamespace(r1, "recreate-", nil)
	dels, done := subscribeRecv(t, admin(), r2, ns)
	if _, err := r1.admin.DeleteNamespace(admin(), &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := r1.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// Within the cache lifetime the old stream ends.
	wantCode(t, <-done, codes.NotFound, "deleted")
	if err := upsertAs(admin(), r1, ns, "new-owner"); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-dels:
		t.Errorf("the old namespace's stream received the new namespace's task %q", d.GetTask().GetId())
	default:
	}
}

// TestSubscribeMemoryFollowsCredit: a stream asking for the largest
// max_in_flight costs memory for what it is given, not for what it asked:
// 50 idle streams asking 10,000 each must not pin their credit up front.
// (Not parallel: it measures the process's heap.)
func TestSubscribeMemoryFollowsCredit(t *testing.T) {
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "credit-", &delaydv1.NamespacePolicy{MaxSubscribers: 1000})
	const streams = 50
	ctx, cancel := context.WithCancel(admin())
	defer cancel()
	before := heapInUse()
	for range streams {
		s, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10000})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Header(); err != nil {
			t.Fatal(err)
		}
	}
	grown := int64(heapInUse()) - int64(before)
	t.Logf("%d idle streams with max_in_flight 10,000: heap %+d KiB", streams, grown>>10)
	if grown > 16<<20 {
		t.Errorf("%d idle streams pinned %d MiB; want memory to follow the credit used", streams, grown>>20)
	}
}

// TestStreamsPerKeyCap: one API key holds at most Limits.MaxStreamsPerKey
// Subscribe streams on a replica, across namespaces; and a namespace's
// max_subscribers has a finite default.
func TestStreamsPerKeyCap(t *testing.T) {
	t.Parallel()
	if got := storage.DefaultPolicy().MaxSubscribers; got <= 0 {
		t.Errorf("the default max_subscribers is %d; want a finite default", got)
	}
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Limits.MaxStreamsPerKey = 2 }})
	ns := e.newNamespace(r, "perkey-", nil)
	_, secret := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	ctx, cancel := context.WithCancel(as(secret))
	defer cancel()
	open := func(ctx context.Context) error {
		s, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns})
		if err != nil {
			return err
		}
		// A registered stream sends headers; a refused one ends at once
		// (its trailers then carry the status).
		if md, err := s.Header(); err != nil || len(md) == 0 {
			_, err = s.Recv()
			return err
		}
		return nil
	}
	for i := range 2 {
		if err := open(ctx); err != nil {
			t.Fatalf("stream %d under the cap: %v", i, err)
		}
	}
	wantCode(t, open(ctx), codes.ResourceExhausted, "at most 2 per key")
	// Another key of the same namespace is not affected.
	_, other := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	if err := open(as(other)); err != nil {
		t.Errorf("another key: %v", err)
	}
}

// craftedToken builds a page token of the server's layout around a cursor
// the store never made.
func craftedToken(ns string, state byte, cursor string) string {
	b := append([]byte{1, state, byte(len(ns))}, ns...)
	return base64.RawURLEncoding.EncodeToString(append(b, cursor...))
}

// TestCraftedPageTokenIsInvalidArgument: a page token that decodes but
// carries a cursor the store never made answers InvalidArgument, and
// nothing is logged at ERROR.
func TestCraftedPageTokenIsInvalidArgument(t *testing.T) {
	t.Parallel()
	var logs testkit.SyncBuffer
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	ns := e.newNamespace(r, "token-", nil)
	_, err := r.tasks.ListTasks(admin(), &delaydv1.ListTasksRequest{Namespace: ns, PageToken: craftedToken(ns, 1, "not:a:cursor")})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	_, err = r.admin.ListDeadLetters(admin(), &delaydv1.ListDeadLettersRequest{Namespace: ns, PageToken: craftedToken(ns, 3, "3:x:y")})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a crafted page token was logged as an error: %s", logs.String())
	}
}

// TestRequestLogNeverWritesAnInvalidNamespace: a request without a key
// naming a 1 MiB namespace must not put it in the request log.
func TestRequestLogNeverWritesAnInvalidNamespace(t *testing.T) {
	t.Parallel()
	var logs testkit.SyncBuffer
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Limits.MaxMessageBytes = 2 << 20
	}})
	huge := strings.Repeat("n", 1<<20)
	_, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: huge, Id: "x"})
	wantCode(t, err, codes.InvalidArgument, "namespace")
	if n := logs.Len(); n > 64<<10 {
		t.Errorf("one request with a 1 MiB namespace wrote %d bytes of log", n)
	}
}

// TestDueTimeAtEpochOrYearOne: a due time at the Unix epoch or in year 1 is
// refused with InvalidArgument naming due_time (it could not be read back
// as sent).
func TestDueTimeAtEpochOrYearOne(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "epoch-", nil)
	for name, ts := range map[string]*timestamppb.Timestamp{
		"epoch":  timestamppb.New(time.Unix(0, 0)),
		"year 1": {Seconds: -62135596800},
	} {
		_, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "t", When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: ts}})
		if codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "due_time") {
			t.Errorf("%s: %v, want InvalidArgument naming due_time", name, err)
		}
	}
	// A recent past time still means due now.
	past := timestamppb.New(time.Now().Add(-time.Hour))
	if _, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "t", When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: past}}); err != nil {
		t.Errorf("a due time an hour ago: %v", err)
	}
}

// TestPendingQuotaUnderConcurrentBatches: 20 concurrent batches of new
// tasks into a namespace with max_pending_tasks 100 leave it with at most
// 100 tasks (the quota is reserved before the write, not checked against a
// count that the other batches have not reached yet).
func TestPendingQuotaUnderConcurrentBatches(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "quotarace-", &delaydv1.NamespacePolicy{MaxPendingTasks: 100})
	var wg sync.WaitGroup
	for b := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			items := make([]*delaydv1.UpsertTaskRequest, 60)
			for i := range items {
				items[i] = &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("b%d-%d", b, i), When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}}
			}
			_, _ = r.tasks.BatchUpsertTasks(admin(), &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: items})
		}()
	}
	wg.Wait()
	st, err := e.store.Stats(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	if total := st.Scheduled + st.Delivered + st.Dead; total > 100 {
		t.Errorf("20 concurrent batches left %d tasks under max_pending_tasks 100", total)
	}
}

// TestNamespaceAdminKeysAreLimited: a namespace-scoped admin key is rate
// limited like the namespace's other keys (a global key is not), and a
// namespace holds at most 100 API keys.
func TestNamespaceAdminKeysAreLimited(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "adminrate-", &delaydv1.NamespacePolicy{RateLimit: 1, RateBurst: 1})
	_, tenantAdmin := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_ADMIN)
	limited := 0
	for range 5 {
		_, err := r.admin.ListKeys(as(tenantAdmin), &delaydv1.ListKeysRequest{Namespace: ns})
		if codeOf(err) == codes.ResourceExhausted {
			limited++
		}
	}
	if limited == 0 {
		t.Errorf("5 admin calls at once by a namespace admin key under rate_limit 1/s: none limited")
	}
	for range 5 {
		if _, err := r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns}); err != nil {
			t.Fatalf("the global admin key was limited: %v", err)
		}
	}
	// Keys per namespace: 1 exists; 99 more fit, the next is refused.
	for i := range 99 {
		if _, err := r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE}}); err != nil {
			t.Fatalf("key %d: %v", i+2, err)
		}
	}
	_, err := r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE}})
	wantCode(t, err, codes.ResourceExhausted, "at most 100")
}

// TestGlobalKeysAreCapped: global API keys were paged but not capped in
// number (issue 11); CreateKey of a global key past Limits.MaxKeys
// (--max-keys) is ResourceExhausted naming the limit, a revoked key frees
// its place, and the same limit caps a namespace's keys.
func TestGlobalKeysAreCapped(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Limits.MaxKeys = 3 }})
	create := func(ns string) (*delaydv1.CreateKeyResponse, error) {
		return r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_ADMIN}})
	}
	var first string
	for i := range 3 {
		resp, err := create(storage.GlobalNamespace)
		if err != nil {
			t.Fatalf("global key %d: %v", i+1, err)
		}
		if i == 0 {
			first = resp.GetKey().GetId()
		}
	}
	_, err := create(storage.GlobalNamespace)
	wantCode(t, err, codes.ResourceExhausted, "at most 3, --max-keys")
	if _, err := r.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := create(storage.GlobalNamespace); err != nil {
		t.Fatalf("global key after a revocation freed a place: %v", err)
	}
	// The namespace's keys have a limit of their own: the global keys do
	// not count.
	ns := e.newNamespace(r, "keycap-", nil)
	for i := range 3 {
		if _, err := create(ns); err != nil {
			t.Fatalf("key %d of %s: %v", i+1, ns, err)
		}
	}
	_, err = create(ns)
	wantCode(t, err, codes.ResourceExhausted, "at most 3, --max-keys")
}

// TestListPagesAreCutByBytes: ListTasks with page_size 1000 over tasks with
// 64 KiB payloads (13 MiB in all) answers pages that fit the message limit,
// each with a next_page_token, and paging through lists every task exactly
// once; the BASIC view leaves payloads out and lists them all in one page.
// Before pages were cut by bytes the first call failed ResourceExhausted.
func TestListPagesAreCutByBytes(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "bytes-", nil)
	const n = 200
	payload := bytes.Repeat([]byte("p"), 64<<10)
	for start := 0; start < n; start += 50 {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
		for i := start; i < start+50; i++ {
			req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{
				Id: fmt.Sprintf("t%03d", i), Payload: payload,
				When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour + time.Duration(i)*time.Second)},
			})
		}
		if _, err := r.tasks.BatchUpsertTasks(admin(), req); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	pages, token := 0, ""
	for {
		resp, err := r.tasks.ListTasks(admin(), &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		pages++
		if size := proto.Size(resp); size > server.DefaultMaxListBytes+64<<10 {
			t.Fatalf("page %d is %d bytes; want at most about %d", pages, size, server.DefaultMaxListBytes)
		}
		if len(resp.GetTasks()) == 0 {
			t.Fatalf("page %d is empty", pages)
		}
		for _, task := range resp.GetTasks() {
			if !bytes.Equal(task.GetPayload(), payload) {
				t.Fatalf("task %s: payload of %d bytes, want %d", task.GetId(), len(task.GetPayload()), len(payload))
			}
			seen[task.GetId()]++
		}
		token = resp.GetNextPageToken()
		if token == "" {
			break
		}
	}
	if len(seen) != n || pages < 10 {
		t.Fatalf("listed %d distinct tasks in %d pages; want %d in 10 or more", len(seen), pages, n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("task %s listed %d times", id, c)
		}
	}
	resp, err := r.tasks.ListTasks(admin(), &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1000, View: delaydv1.TaskView_TASK_VIEW_BASIC})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTasks()) != n || resp.GetNextPageToken() != "" {
		t.Fatalf("BASIC view: %d tasks, next %q; want %d in one page", len(resp.GetTasks()), resp.GetNextPageToken(), n)
	}
	for _, task := range resp.GetTasks() {
		if len(task.GetPayload()) != 0 {
			t.Fatalf("BASIC view: task %s carries a payload", task.GetId())
		}
	}
	_, err = r.tasks.ListTasks(admin(), &delaydv1.ListTasksRequest{Namespace: ns, View: 7})
	wantCode(t, err, codes.InvalidArgument, "view")
	_, err = r.admin.ListDeadLetters(admin(), &delaydv1.ListDeadLettersRequest{Namespace: ns, View: 7})
	wantCode(t, err, codes.InvalidArgument, "view")
}

// TestListKeysIsPagedAndCutByBytes: ListKeys pages (page_size,
// page_token) through every key exactly once, a page is cut by bytes even
// when page_size would allow more (here with a 4 KiB list budget and
// 256-character descriptions), and a crafted token answers InvalidArgument.
// ListNamespaces pages are cut by bytes the same way. Before, ListKeys
// answered every key of the namespace in one reply.
func TestListKeysIsPagedAndCutByBytes(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Limits.MaxListBytes = 4 << 10 }})
	ns := e.newNamespace(r, "keys-", nil)
	want := map[string]bool{}
	for range 40 {
		resp, err := r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{
			Namespace: ns, Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE}, Description: strings.Repeat("d", 256),
		})
		if err != nil {
			t.Fatal(err)
		}
		want[resp.GetKey().GetId()] = true
	}
	pageThrough := func(size int32) (seen map[string]int, pages int) {
		seen = map[string]int{}
		token := ""
		for {
			resp, err := r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns, PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("page %d: %v", pages+1, err)
			}
			pages++
			if len(resp.GetKeys()) == 0 || len(resp.GetKeys()) > int(size) {
				t.Fatalf("page %d has %d keys for page_size %d", pages, len(resp.GetKeys()), size)
			}
			if n := proto.Size(resp); n > 4<<10+1<<10 {
				t.Fatalf("page %d is %d bytes; want about 4 KiB at most", pages, n)
			}
			for _, k := range resp.GetKeys() {
				seen[k.GetId()]++
			}
			if token = resp.GetNextPageToken(); token == "" {
				return seen, pages
			}
		}
	}
	for _, size := range []int32{7, 1000} {
		seen, pages := pageThrough(size)
		if len(seen) != len(want) {
			t.Fatalf("page_size %d: listed %d distinct keys, want %d", size, len(seen), len(want))
		}
		for id, c := range seen {
			if !want[id] || c != 1 {
				t.Errorf("page_size %d: key %s listed %d times (created here: %v)", size, id, c, want[id])
			}
		}
		if pages < 4 {
			t.Errorf("page_size %d: %d pages; 40 keys of ~300 bytes under 4 KiB need at least 4", size, pages)
		}
	}
	_, err := r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns, PageToken: craftedToken("*keys:"+ns, 0, "x:y")})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	first, err := r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: storage.GlobalNamespace, PageToken: first.GetNextPageToken()})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	_, err = r.admin.ListKeys(admin(), &delaydv1.ListKeysRequest{Namespace: ns, PageSize: 1001})
	wantCode(t, err, codes.InvalidArgument, "page_size")

	for range 60 {
		e.newNamespace(r, "keys-", nil)
	}
	nsResp, err := r.admin.ListNamespaces(admin(), &delaydv1.ListNamespacesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(nsResp); n > 4<<10+1<<10 || nsResp.GetNextPageToken() == "" {
		t.Fatalf("ListNamespaces page of %d bytes (%d namespaces), next %q; want at most about 4 KiB and a next page",
			n, len(nsResp.GetNamespaces()), nsResp.GetNextPageToken())
	}
}
