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

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// TestCallLogLevels: at the default INFO level a successful call writes
// nothing, while failures, slow calls and (at DEBUG) every call do.
func TestCallLogLevels(t *testing.T) {
	t.Parallel()
	req := &delaydv1.UpsertTaskRequest{Namespace: "orders", Id: "o1"}
	ok := func(context.Context, any) (any, error) { return &delaydv1.UpsertTaskResponse{}, nil }
	failWith := func(c codes.Code) grpc.UnaryHandler {
		return func(context.Context, any) (any, error) { return nil, status.Error(c, "because") }
	}
	slowOK := func(context.Context, any) (any, error) { time.Sleep(2 * time.Millisecond); return nil, nil }
	cases := []struct {
		name    string
		level   slog.Level
		slow    time.Duration
		handler grpc.UnaryHandler
		want    string // "" = nothing logged
	}{
		{"ok at info", slog.LevelInfo, 0, ok, ""},
		{"canceled at info", slog.LevelInfo, 0, failWith(codes.Canceled), ""},
		{"not found at info", slog.LevelInfo, 0, failWith(codes.NotFound), ""},
		{"ok at debug", slog.LevelDebug, 0, ok, `level=DEBUG msg="finished call"`},
		{"invalid argument at info", slog.LevelInfo, 0, failWith(codes.InvalidArgument), `level=INFO msg="finished call"`},
		{"unavailable at info", slog.LevelInfo, 0, failWith(codes.Unavailable), `level=WARN msg="finished call"`},
		{"internal at info", slog.LevelInfo, 0, failWith(codes.Internal), `level=ERROR msg="finished call"`},
		{"slow ok at info", slog.LevelInfo, time.Millisecond, slowOK, `level=WARN msg="slow call"`},
		{"slow never", slog.LevelInfo, -1, slowOK, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			unary, _ := interceptors(logger, CallLog{SlowCall: tc.slow}, newAdmissionCodec(DefaultMaxBatch))
			_, _ = unary[1](context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/delayd.v1.TaskService/UpsertTask"}, tc.handler)
			got := buf.String()
			if tc.want == "" {
				if got != "" {
					t.Fatalf("logged %q, want nothing", got)
				}
				return
			}
			for _, w := range []string{tc.want, "grpc.method=UpsertTask", "namespace=orders", "grpc.time_ms="} {
				if !strings.Contains(got, w) {
					t.Errorf("log %q lacks %q", got, w)
				}
			}
		})
	}
}

// TestCallLogOffAllocatesNothing: a call whose log level is off costs no
// allocation in the request log (the handler's own aside).
func TestCallLogOffAllocatesNothing(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	unary, _ := interceptors(logger, CallLog{}, newAdmissionCodec(DefaultMaxBatch))
	info := &grpc.UnaryServerInfo{FullMethod: "/delayd.v1.TaskService/UpsertTask"}
	req := &delaydv1.UpsertTaskRequest{Namespace: "orders", Id: "o1"}
	resp := &delaydv1.UpsertTaskResponse{}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _, _ = unary[1](ctx, req, info, handler) }); n != 0 {
		t.Fatalf("request log allocates %.1f times per call with its level off, want 0", n)
	}
}

// BenchmarkCallLog: the request log's cost per call, off (INFO, a
// successful call) and on (DEBUG).
func BenchmarkCallLog(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: "/delayd.v1.TaskService/UpsertTask"}
	req := &delaydv1.UpsertTaskRequest{Namespace: "orders", Id: "o1"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, lvl := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		b.Run(lvl.String(), func(b *testing.B) {
			logger := slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: lvl}))
			unary, _ := interceptors(logger, CallLog{}, newAdmissionCodec(DefaultMaxBatch))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = unary[1](context.Background(), req, info, handler)
			}
		})
	}
}
