package rpcerr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/storage"
)

func TestToStatus(t *testing.T) {
	t.Parallel()
	const secret = "dial tcp 10.1.2.3:6379: connect: connection refused"
	rawStore := errors.New("ERR some redis text " + secret)
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		msg    string
		logged bool
	}{
		{"nil", nil, codes.OK, "", false},
		{"field", Invalidf("tasks[1].id", "is bad"), codes.InvalidArgument, "tasks[1].id is bad", false},
		{"status passes", status.Error(codes.NotFound, "task \"x\" not found"), codes.NotFound, "task \"x\" not found", false},
		{"not found", fmt.Errorf("get: %w", storage.ErrNotFound), codes.NotFound, MsgNotFound, false},
		{"unavailable", fmt.Errorf("upsert: %w: %s", storage.ErrUnavailable, secret), codes.Unavailable, MsgUnavailable, true},
		{"store deadline", fmt.Errorf("upsert: %w", context.DeadlineExceeded), codes.Unavailable, MsgUnavailable, true},
		{"net error", fmt.Errorf("get: %w", netErr), codes.Unavailable, MsgUnavailable, true},
		{"quota", fmt.Errorf("upsert: %w", storage.ErrQuotaExceeded), codes.ResourceExhausted, MsgQuota, false},
		{"exists", storage.ErrAlreadyExists, codes.AlreadyExists, MsgExists, false},
		{"not empty", storage.ErrNotEmpty, codes.FailedPrecondition, MsgNotEmpty, false},
		{"stale", storage.ErrStale, codes.Aborted, MsgStale, false},
		{"unknown", fmt.Errorf("list: %w", rawStore), codes.Internal, MsgInternal, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&buf, nil))
			err := ToStatus(context.Background(), logger, tt.err)
			st := status.Convert(err)
			if st.Code() != tt.code || st.Message() != tt.msg {
				t.Fatalf("ToStatus = %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if strings.Contains(st.Message(), "10.1.2.3") || strings.Contains(st.Message(), "ERR") {
				t.Fatalf("raw store text reached the client: %q", st.Message())
			}
			if logged := buf.Len() > 0; logged != tt.logged {
				t.Fatalf("logged = %v (%q), want %v", logged, buf.String(), tt.logged)
			}
			if tt.logged && !strings.Contains(buf.String(), tt.err.Error()[:10]) {
				t.Fatalf("the real error is not in the log: %q", buf.String())
			}
		})
	}

	t.Run("request deadline is the client's", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := ToStatus(ctx, nil, fmt.Errorf("get: %w: %w", storage.ErrUnavailable, context.Canceled))
		if status.Code(err) != codes.Canceled {
			t.Fatalf("code = %v, want Canceled", status.Code(err))
		}
	})
}
