package guard

import (
	"context"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// tapLookupTimeout bounds the registry read the tap handle makes for a key
// its cache does not hold. The tap runs on the connection's reader
// goroutine, so the wait holds only that connection's frames; a read that
// takes longer lets the call in, and authentication decides after the body
// was read, as it would with the store down.
const tapLookupTimeout = 500 * time.Millisecond

// tapAuth returns the InTapHandle that refuses, before the stream is
// accepted, calls to delayd services whose bearer key is missing,
// malformed, unknown, revoked or wrong (authenticator.lookup).
func tapAuth(a *authenticator) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if OpenMethod(info.FullMethodName) {
			return ctx, nil
		}
		lctx, cancel := context.WithTimeout(ctx, tapLookupTimeout)
		defer cancel()
		if _, err := a.lookup(lctx, info.Header.Get("authorization")); err != nil {
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			// The registry could not answer in time: authentication
			// decides after.
		}
		return ctx, nil
	}
}
