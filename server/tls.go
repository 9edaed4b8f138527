package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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

// tlsServerOptions is the grpc.Creds option for opts.TLS (none when nil).
func tlsServerOptions(opts Options) []grpc.ServerOption {
	if opts.TLS == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(opts.TLS))}
}
