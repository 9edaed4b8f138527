package guard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/delayd/delayd/storage"
)

// certCheckInterval is how often, at most, the certificate files are
// checked for a change (a rotated certificate is picked up without a
// restart).
const certCheckInterval = 10 * time.Second

// LoadTLSConfig builds the listener's TLS configuration from PEM files:
// certFile and keyFile are the server's certificate chain and private key
// (--tls-cert, --tls-key; both required). If clientCAFile is set
// (--tls-client-ca), the server requires every client to present a
// certificate signed by one of the CAs in it (mTLS).
//
// TLS 1.2 is the minimum. The certificate and key are re-read when their
// files change (checked at most every 10 s, on a handshake), so a rotated
// certificate needs no restart; a rotation that fails to load keeps the
// previous certificate and logs a warning. logger may be nil.
func LoadTLSConfig(certFile, keyFile, clientCAFile string, logger *slog.Logger) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: both a certificate (--tls-cert) and a key (--tls-key) are required")
	}
	r := &certReloader{certFile: certFile, keyFile: keyFile, logger: logger}
	if err := r.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.get,
	}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: client CA %s: no PEM certificate in it", clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// certReloader serves the server certificate, re-reading the files when
// their modification time changes.
type certReloader struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	mod     [2]time.Time
	checked time.Time
}

func (r *certReloader) load() error {
	ci, err := os.Stat(r.certFile)
	if err != nil {
		return fmt.Errorf("tls: certificate: %w", err)
	}
	ki, err := os.Stat(r.keyFile)
	if err != nil {
		return fmt.Errorf("tls: key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tls: certificate and key: %w", err)
	}
	r.cert, r.mod = &cert, [2]time.Time{ci.ModTime(), ki.ModTime()}
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certCheckInterval {
		r.checked = now
		ci, err1 := os.Stat(r.certFile)
		ki, err2 := os.Stat(r.keyFile)
		if err1 == nil && err2 == nil && (!ci.ModTime().Equal(r.mod[0]) || !ki.ModTime().Equal(r.mod[1])) {
			if err := r.load(); err != nil { // r.cert is unchanged on failure
				if r.logger != nil {
					r.logger.Warn("TLS certificate changed on disk but did not load; still serving the previous one", "error", err)
				}
			} else if r.logger != nil {
				r.logger.Info("TLS certificate reloaded", "cert", r.certFile)
			}
		}
	}
	return r.cert, nil
}

// tlsServerOptions is the grpc.Creds option for cfg (none when nil); the
// credentials report every refused handshake to refused.
func tlsServerOptions(cfg *tls.Config, refused *handshakeLog) []grpc.ServerOption {
	if cfg == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(loggedCreds{TransportCredentials: credentials.NewTLS(cfg), refused: refused})}
}

// refusedLogEvery is the least time between two "TLS handshake refused"
// lines; the refusals in between are counted in the next line.
const refusedLogEvery = 10 * time.Second

// handshakeLog logs refused TLS handshakes — a client without a certificate
// from --tls-client-ca, a plaintext client on a TLS port, a client that
// does not trust the server's certificate — at WARN with the peer's address
// and the reason, at most one line per refusedLogEvery, so an operator sees
// why a client cannot connect and a client retrying in a loop cannot flood
// the log. A peer that closes before sending anything (a TCP health check)
// is logged at DEBUG only. Safe for concurrent use.
type handshakeLog struct {
	logger *slog.Logger
	now    func() time.Time

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func newHandshakeLog(logger *slog.Logger, clock storage.Clock) *handshakeLog {
	if clock == nil {
		clock = storage.SystemClock{}
	}
	return &handshakeLog{logger: logger, now: clock.Now}
}

// refused records one refused handshake on listener ("grpc", "http") from
// peer.
func (h *handshakeLog) refused(listener, peer string, reason error) {
	if errors.Is(reason, io.EOF) {
		h.logger.Debug("TLS handshake: peer closed before a ClientHello", "listener", listener, "peer", peer)
		return
	}
	h.mu.Lock()
	now := h.now()
	if !h.last.IsZero() && now.Sub(h.last) < refusedLogEvery {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	h.last = now
	n := h.suppressed
	h.suppressed = 0
	h.mu.Unlock()
	h.logger.Warn("TLS handshake refused: the client cannot connect", "listener", listener, "peer", peer,
		"reason", reason.Error(), "refused_unlogged", n,
		"hint", "a client certificate from --tls-client-ca, a client that trusts --tls-cert, and TLS on both ends are required")
}

// loggedCreds are gRPC transport credentials that report refused server
// handshakes to a handshakeLog.
type loggedCreds struct {
	credentials.TransportCredentials
	refused *handshakeLog
}

// ServerHandshake runs the TLS handshake and reports a refusal.
func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.refused.refused("grpc", raw.RemoteAddr().String(), err)
	}
	return conn, info, err
}

// Clone keeps the logging.
func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), refused: c.refused}
}

// httpErrorLog is the slog.Handler behind the HTTP edge's
// http.Server.ErrorLog (slog.NewLogLogger): a refused TLS handshake
// ("http: TLS handshake error from ADDR: REASON") goes to the handshakeLog,
// anything else is logged at WARN.
type httpErrorLog struct {
	refused *handshakeLog
	logger  *slog.Logger
}

func (w httpErrorLog) Enabled(context.Context, slog.Level) bool { return true }
func (w httpErrorLog) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w httpErrorLog) WithGroup(string) slog.Handler            { return w }

func (w httpErrorLog) Handle(ctx context.Context, r slog.Record) error {
	line := strings.TrimSpace(r.Message)
	if rest, ok := strings.CutPrefix(line, "http: TLS handshake error from "); ok {
		peer, reason, _ := strings.Cut(rest, ": ")
		err := errors.New(reason)
		if reason == "EOF" {
			err = io.EOF
		}
		w.refused.refused("http", peer, err)
		return nil
	}
	w.logger.WarnContext(ctx, "http edge: "+line)
	return nil
}
