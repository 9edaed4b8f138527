package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/status"
)

// The HTTP edge (Connect, gRPC-Web and JSON, transcoded by vanguard in the
// web package) reaches the very same grpc.Server through its ServeHTTP: the
// same services, interceptors (auth, rate limits, quotas), admission codec
// and message limits. What grpc-go's ServeHTTP leaves out is done here:
// the tap handle's key pre-check (HTTPHandler), and the listener's
// connection cap, header-size bound, idle timeout and TLS (ServeHTTPEdge).

// httpReadHeaderTimeout bounds how long a client may take to send its
// request headers on the HTTP edge.
const httpReadHeaderTimeout = handshakeTimeout

// DefaultHTTPBodyTimeout is Limits.HTTPBodyTimeout's default: how long a
// client may take to send a request's body on the HTTP edge, from its
// headers to its end (a 5 MiB body needs 90 KB/s). A body still arriving
// then fails the call and frees the connection; once the body has ended
// the deadline is lifted, so a streamed answer (Subscribe) lasts as long as
// it needs.
const DefaultHTTPBodyTimeout = time.Minute

// HTTPHandler returns the Server as an http.Handler speaking the gRPC
// protocol (HTTP/2 requests, as vanguard produces them). With auth on, a
// call without a well-formed key is refused with Unauthenticated before
// the server reads its body, as on the gRPC listener.
func (s *Server) HTTPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.guard.AdmitHTTP(r); err != nil {
			writeGRPCError(w, err)
			return
		}
		s.grpc.ServeHTTP(w, r)
	})
}

// AdmitHTTP authenticates an HTTP edge request to a delayd RPC (path
// /<service>/<method>) as the gRPC tap handle does, from its headers only:
// nil when it may go on (or auth is off), otherwise the status to answer
// (Unauthenticated for a missing, malformed, unknown or revoked key). The
// HTTP edge calls it before it reads or decodes the body, so a made-up key
// costs no JSON decoding whatever the body's size.
func (s *Server) AdmitHTTP(r *http.Request) error { return s.guard.AdmitHTTP(r) }

// MaxRepeatedItems is the most items one repeated field of a request may
// hold (Limits.MaxBatch with its default filled in); the HTTP edge caps
// JSON arrays by it before decoding them.
func (s *Server) MaxRepeatedItems() int { return s.limits.MaxBatch }

// writeGRPCError answers a gRPC call with a trailers-only error response.
func writeGRPCError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", fmt.Sprint(int32(st.Code())))
	h.Set("Grpc-Message", encodeGRPCMessage(st.Message()))
	w.WriteHeader(http.StatusOK)
}

// encodeGRPCMessage percent-encodes a grpc-message value as the gRPC
// protocol requires (bytes outside printable ASCII, and '%').
func encodeGRPCMessage(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// ServeHTTPEdge serves h on lis until ShutdownHTTPEdge, with the Server's
// limits: at most Limits.MaxConnections connections (more are closed at
// once, unless a peer holds more than its share idle: see conns.go), header lists bounded as on the gRPC listener, connections idle for
// Limits.MaxConnectionIdle closed, and TLS with Options.TLS when set (the
// same certificate, and mTLS, as the gRPC listener). Plaintext connections
// may speak HTTP/1.1 or HTTP/2 (h2c). It returns nil after a shutdown.
func (s *Server) ServeHTTPEdge(lis net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           bodyDeadline(h, s.limits.HTTPBodyTimeout),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       s.limits.MaxConnectionIdle,
		MaxHeaderBytes:    maxHeaderListBytes,
		Protocols:         new(http.Protocols),
		ConnState:         s.conns.httpConnState,
	}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	s.mu.Lock()
	if s.httpStopped {
		s.mu.Unlock()
		return nil
	}
	s.httpSrv = append(s.httpSrv, srv)
	s.mu.Unlock()

	lis = newLimitListener(lis, s.limits, s.conns)
	var err error
	if tlsConfig := s.guard.TLS(); tlsConfig != nil {
		srv.TLSConfig = tlsConfig.Clone()
		srv.ErrorLog = s.guard.HTTPErrorLog(s.logger)
		err = srv.ServeTLS(lis, "", "")
	} else {
		err = srv.Serve(lis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve http: %w", err)
}

// bodyDeadline gives each request until d to send its body, lifting the
// deadline when the body ends.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil && r.Body != nil && r.Body != http.NoBody {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, after: d}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the connection's read deadline once the body ended,
// and says what a read that failed on the deadline means.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	after time.Duration
	done  bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = &BodyTimeoutError{After: b.after}
	}
	return n, err
}

// BodyTimeoutError is the error a request body's Read returns on the HTTP
// edge when the body has not ended within Limits.HTTPBodyTimeout of the
// request's headers. It is an os.ErrDeadlineExceeded.
type BodyTimeoutError struct {
	// After is the limit, Limits.HTTPBodyTimeout.
	After time.Duration
}

func (e *BodyTimeoutError) Error() string {
	return fmt.Sprintf("the request body did not end within %v of the request's headers; send it faster or in smaller calls", e.After)
}

// Unwrap makes a BodyTimeoutError an os.ErrDeadlineExceeded.
func (e *BodyTimeoutError) Unwrap() error { return os.ErrDeadlineExceeded }

// ShutdownHTTPEdge stops every ServeHTTPEdge: no new connections, running
// calls finish; when ctx ends first, the remaining connections are closed.
// Streams the gRPC server ends (GracefulStop) end their HTTP calls too.
func (s *Server) ShutdownHTTPEdge(ctx context.Context) error {
	s.mu.Lock()
	s.httpStopped = true
	srvs := s.httpSrv
	s.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
			errs = append(errs, fmt.Errorf("http edge shutdown: %w", err))
		}
	}
	return errors.Join(errs...)
}

// MaxMessageBytes is the largest message the server receives or sends
// (Limits.MaxMessageBytes with its default filled in).
func (s *Server) MaxMessageBytes() int { return s.limits.MaxMessageBytes }
