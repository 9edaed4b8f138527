package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
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

// HTTPHandler returns the Server as an http.Handler speaking the gRPC
// protocol (HTTP/2 requests, as vanguard produces them). With auth on, a
// call without a well-formed key is refused with Unauthenticated before
// the server reads its body, as on the gRPC listener.
func (s *Server) HTTPHandler() http.Handler {
	if s.tap == nil {
		return s.grpc
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		md := metadata.MD{}
		for k, v := range r.Header {
			md[strings.ToLower(k)] = v
		}
		if _, err := s.tap(r.Context(), &tap.Info{FullMethodName: r.URL.Path, Header: md}); err != nil {
			writeGRPCError(w, err)
			return
		}
		s.grpc.ServeHTTP(w, r)
	})
}

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
// once), header lists bounded as on the gRPC listener, connections idle for
// Limits.MaxConnectionIdle closed, and TLS with Options.TLS when set (the
// same certificate, and mTLS, as the gRPC listener). Plaintext connections
// may speak HTTP/1.1 or HTTP/2 (h2c). It returns nil after a shutdown.
func (s *Server) ServeHTTPEdge(lis net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       s.limits.MaxConnectionIdle,
		MaxHeaderBytes:    maxHeaderListBytes,
		Protocols:         new(http.Protocols),
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

	lis = &limitListener{Listener: lis, max: int64(s.limits.MaxConnections)}
	var err error
	if s.tlsConfig != nil {
		srv.TLSConfig = s.tlsConfig.Clone()
		// net/http reports a refused handshake on its ErrorLog; it goes to
		// the same rate-limited WARN line as the gRPC listener's.
		srv.ErrorLog = slog.NewLogLogger(httpErrorLog{refused: s.refused, logger: s.logger}, slog.LevelWarn)
		err = srv.ServeTLS(lis, "", "")
	} else {
		err = srv.Serve(lis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve http: %w", err)
}

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
