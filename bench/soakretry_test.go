package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUpsertRetryingRetriesUnavailableOnly: the soak's producers retry an
// UNAVAILABLE answer, as delayd tells clients to, and count it; any other
// error ends the soak at once.
func TestUpsertRetryingRetriesUnavailableOnly(t *testing.T) {
	for _, tc := range []struct {
		name        string
		answers     []error
		wantErr     bool
		wantCalls   int
		wantRetries int64
	}{
		{"ok at once", []error{nil}, false, 1, 0},
		{"unavailable twice, then ok", []error{status.Error(codes.Unavailable, "store unavailable, safe to retry"), status.Error(codes.Unavailable, "x"), nil}, false, 3, 2},
		{"unavailable wrapped, as ds.upsert answers it", []error{fmt.Errorf("UpsertTask: %w", status.Error(codes.Unavailable, "x")), nil}, false, 2, 1},
		{"invalid argument: no retry", []error{status.Error(codes.InvalidArgument, "bad")}, true, 1, 0},
		{"not a status: no retry", []error{errors.New("boom")}, true, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var retries atomic.Int64
			calls := 0
			err := upsertRetrying(context.Background(), func() error {
				calls++
				return tc.answers[min(calls, len(tc.answers))-1]
			}, &retries)
			if (err != nil) != tc.wantErr || calls != tc.wantCalls || retries.Load() != tc.wantRetries {
				t.Errorf("err %v, calls %d, retries %d; want error %v, %d calls, %d retries", err, calls, retries.Load(), tc.wantErr, tc.wantCalls, tc.wantRetries)
			}
		})
	}
}
