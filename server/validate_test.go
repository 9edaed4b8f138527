package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// These are unit tests of the pure edge functions (validation, page
// tokens, error mapping, interceptors). Every RPC is tested end to end over
// real gRPC and a real Redis in task_test.go and server_test.go.

func TestValidateKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind string
		ok   bool
		want string // part of the message
	}{
		{"", true, ""},
		{"order.close", true, ""},
		{"Bestellung schließen ✓", true, ""},
		{strings.Repeat("é", maxKindLen), true, ""}, // 128 characters, 256 bytes
		{strings.Repeat("k", maxKindLen+1), false, "is 129 characters long; at most 128"},
		{"tab\there", false, "non-printable character U+0009"},
		{"nul\x00", false, "non-printable character U+0000"},
		{"bad\xffutf8", false, "is not valid UTF-8"},
	}
	for _, tt := range tests {
		err := validateKind("tasks[2].kind", tt.kind)
		if (err == nil) != tt.ok {
			t.Errorf("validateKind(%q) = %v, want ok=%v", tt.kind, err, tt.ok)
			continue
		}
		if err != nil && (!strings.HasPrefix(err.Error(), "tasks[2].kind ") || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("validateKind(%q) = %q, want field name and %q", tt.kind, err, tt.want)
		}
	}
}

func TestUpsertSpec(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	pol := storage.DefaultPolicy()
	pol.MaxPayloadBytes = 10
	delay := func(d time.Duration) *delaydv1.UpsertTaskRequest_Delay {
		return &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(d)}
	}
	due := func(t time.Time) *delaydv1.UpsertTaskRequest_DueTime {
		return &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(t)}
	}
	tests := []struct {
		name    string
		req     *delaydv1.UpsertTaskRequest
		batchNS string
		want    storage.UpsertSpec
		err     string // "" = accepted; else the whole message
	}{
		{name: "delay", req: &delaydv1.UpsertTaskRequest{Id: "a", Kind: "k", Payload: []byte("p"), When: delay(30 * time.Second)},
			want: storage.UpsertSpec{ID: "a", Kind: "k", Payload: []byte("p"), Delay: 30 * time.Second}},
		{name: "zero delay", req: &delaydv1.UpsertTaskRequest{Id: "a", When: delay(0)}, want: storage.UpsertSpec{ID: "a"}},
		{name: "due time", req: &delaydv1.UpsertTaskRequest{Id: "a", When: due(now.Add(time.Hour))},
			want: storage.UpsertSpec{ID: "a", DueTime: now.Add(time.Hour)}},
		{name: "due time in the past", req: &delaydv1.UpsertTaskRequest{Id: "a", When: due(now.Add(-time.Hour))},
			want: storage.UpsertSpec{ID: "a", DueTime: now.Add(-time.Hour)}},
		{name: "at the horizon", req: &delaydv1.UpsertTaskRequest{Id: "a", When: delay(pol.MaxDelay)},
			want: storage.UpsertSpec{ID: "a", Delay: pol.MaxDelay}},
		{name: "batch item with batch namespace", batchNS: "b", req: &delaydv1.UpsertTaskRequest{Namespace: "b", Id: "a", When: delay(0)},
			want: storage.UpsertSpec{ID: "a"}},

		{name: "no when", req: &delaydv1.UpsertTaskRequest{Id: "a"},
			err: "due_time or delay is required: set exactly one of them"},
		{name: "negative delay", req: &delaydv1.UpsertTaskRequest{Id: "a", When: delay(-time.Second)},
			err: "delay is -1s; it must not be negative (use 0s for due now)"},
		{name: "delay beyond horizon", req: &delaydv1.UpsertTaskRequest{Id: "a", When: delay(pol.MaxDelay + 24*time.Hour)},
			err: "delay is 367 days; at most 366 days (the namespace's horizon) is allowed"},
		{name: "due beyond horizon", req: &delaydv1.UpsertTaskRequest{Id: "a", When: due(now.Add(400 * 24 * time.Hour))},
			err: "due_time is " + now.Add(400*24*time.Hour).UTC().Format(time.RFC3339) + "; at most 366 days ahead (the namespace's horizon, until " + now.Add(366*24*time.Hour).UTC().Format(time.RFC3339) + ") is allowed"},
		// Year 9999 once read "106752.0 days ahead" (a saturated duration).
		{name: "due in year 9999", req: &delaydv1.UpsertTaskRequest{Id: "a", When: due(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))},
			err: "due_time is 9999-12-31T00:00:00Z; at most 366 days ahead (the namespace's horizon, until " + now.Add(366*24*time.Hour).UTC().Format(time.RFC3339) + ") is allowed"},
		{name: "invalid timestamp", req: &delaydv1.UpsertTaskRequest{Id: "a",
			When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: &timestamppb.Timestamp{Nanos: -1}}},
			err: "due_time is not a valid timestamp; allowed: 0001-01-01 to 9999-12-31 UTC"},
		{name: "payload too big", req: &delaydv1.UpsertTaskRequest{Id: "a", Payload: make([]byte, 11), When: delay(0)},
			err: "payload is 11 bytes; at most 10 bytes are allowed in this namespace"},
		{name: "empty id", req: &delaydv1.UpsertTaskRequest{When: delay(0)},
			err: "id is required: 1-128 characters of [A-Za-z0-9._-]"},
		{name: "id with hash tag", req: &delaydv1.UpsertTaskRequest{Id: "a{b}", When: delay(0)},
			err: `id has '{' at position 1; allowed: 1-128 characters of [A-Za-z0-9._-]`},
		{name: "foreign namespace in batch", batchNS: "b", req: &delaydv1.UpsertTaskRequest{Namespace: "c", Id: "a", When: delay(0)},
			err: `tasks[4].namespace is "c"; it must be empty or equal the batch namespace "b"`},
		{name: "batch item field names", batchNS: "b", req: &delaydv1.UpsertTaskRequest{Id: "a"},
			err: "tasks[4].due_time or tasks[4].delay is required: set exactly one of them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := ""
			if tt.batchNS != "" {
				prefix = "tasks[4]."
			}
			got, err := upsertSpec(prefix, tt.req, tt.batchNS, pol, now)
			if tt.err != "" {
				want := tt.err
				if !strings.HasPrefix(want, prefix) {
					want = prefix + want
				}
				if err == nil || err.Error() != want {
					t.Fatalf("error = %v\nwant    %s", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tt.want.ID || got.Kind != tt.want.Kind || !bytes.Equal(got.Payload, tt.want.Payload) ||
				got.Delay != tt.want.Delay || !got.DueTime.Equal(tt.want.DueTime) {
				t.Fatalf("spec = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPageSizeAndState(t *testing.T) {
	t.Parallel()
	for in, want := range map[int32]int{0: 100, 1: 1, 1000: 1000} {
		if got, err := pageSize(in); err != nil || got != want {
			t.Errorf("pageSize(%d) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []int32{-1, 1001} {
		if _, err := pageSize(in); err == nil || !strings.HasPrefix(err.Error(), "page_size is ") {
			t.Errorf("pageSize(%d) = %v, want a page_size error", in, err)
		}
	}
	if got, err := listState(delaydv1.TaskState_TASK_STATE_UNSPECIFIED); err != nil || got != storage.StateScheduled {
		t.Errorf("listState(UNSPECIFIED) = %v, %v; want scheduled", got, err)
	}
	if _, err := listState(delaydv1.TaskState(42)); err == nil || !strings.HasPrefix(err.Error(), "state is 42; allowed: ") {
		t.Errorf("listState(42) = %v", err)
	}
}

func TestPageTokenBoundToList(t *testing.T) {
	t.Parallel()
	tok := encodePageToken("orders", storage.StateScheduled, "cursor-1")
	if got, err := decodePageToken(tok, "orders", storage.StateScheduled); err != nil || got != "cursor-1" {
		t.Fatalf("decode = %q, %v", got, err)
	}
	if encodePageToken("orders", storage.StateScheduled, "") != "" {
		t.Fatal("the last page must have an empty next_page_token")
	}
	for _, c := range []struct {
		tok, ns string
		state   storage.State
		want    string
	}{
		{tok, "billing", storage.StateScheduled, "page_token was issued for another namespace or state"},
		{tok, "orders", storage.StateDead, "page_token was issued for another namespace or state"},
		{"not base64!", "orders", storage.StateScheduled, "page_token is not a token this server issued"},
		{"AQEGb3JkZXJz", "orders", storage.StateScheduled, "page_token is not a token this server issued"}, // no cursor
	} {
		_, err := decodePageToken(c.tok, c.ns, c.state)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("decode(%q, %q, %v) = %v, want %q", c.tok, c.ns, c.state, err, c.want)
		}
	}
}

// chainUnary runs req through the server's unary interceptors into handler.
func chainUnary(ctx context.Context, logger *slog.Logger, method string, req any, handler grpc.UnaryHandler) (any, error) {
	unary, _ := interceptors(logger, CallLog{}, newAdmissionCodec(DefaultMaxBatch))
	info := &grpc.UnaryServerInfo{FullMethod: method}
	h := handler
	for i := len(unary) - 1; i >= 0; i-- {
		next, ic := h, unary[i]
		h = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, next) }
	}
	return h(ctx, req)
}

func TestRecoveryAnswersGenericInternal(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	_, err := chainUnary(context.Background(), logger, "/delayd.v1.TaskService/GetTask", &delaydv1.GetTaskRequest{Namespace: "ns"},
		func(context.Context, any) (any, error) { panic("boom: secret internals") })
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != rpcerr.MsgInternal {
		t.Fatalf("status = %v %q, want Internal %q", st.Code(), st.Message(), rpcerr.MsgInternal)
	}
	if !strings.Contains(buf.String(), "panic in handler") || !strings.Contains(buf.String(), "boom: secret internals") {
		t.Fatalf("panic not logged: %q", buf.String())
	}
}

func TestRequestLogHasNamespaceNotPayload(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	req := &delaydv1.UpsertTaskRequest{Namespace: "orders-eu", Id: "o1", Payload: []byte("card-4111-1111")}
	_, err := chainUnary(context.Background(), logger, "/delayd.v1.TaskService/UpsertTask", req,
		func(context.Context, any) (any, error) { return nil, status.Error(codes.NotFound, "nope") })
	if status.Code(err) != codes.NotFound {
		t.Fatalf("code = %v", status.Code(err))
	}
	line := buf.String()
	for _, want := range []string{"finished call", "grpc.method=UpsertTask", "namespace=orders-eu", "grpc.code=NotFound", "grpc.time_ms="} {
		if !strings.Contains(line, want) {
			t.Errorf("request log %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "card-4111") || strings.Contains(line, "o1") {
		t.Errorf("request log contains request content: %q", line)
	}
}

// TestListStateRoundTrip: every listable state goes to the wire and back.
func TestListStateRoundTrip(t *testing.T) {
	for s := storage.StateScheduled; s <= storage.StateDead; s++ {
		if back, err := listState(wire.State(s)); err != nil || back != s {
			t.Errorf("listState(wire.State(%s)) = %s, %v", s, back, err)
		}
	}
}
