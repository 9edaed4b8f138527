package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
)

// testCA is a certificate authority made inside the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate for a server (127.0.0.1) or a client and
// returns its PEM certificate and key.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsFixture is a CA, a server certificate and key on disk, and client
// certificates from that CA and from a rogue one.
type tlsFixture struct {
	ca, rogue                 *testCA
	certFile, keyFile, caFile string
	clientCert, rogueCert     tls.Certificate
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	dir := t.TempDir()
	f := &tlsFixture{ca: newTestCA(t, "delayd test CA"), rogue: newTestCA(t, "rogue CA")}
	cert, key := f.ca.issue(t, "delayd", x509.ExtKeyUsageServerAuth)
	f.certFile = writeFile(t, dir, "server.pem", cert)
	f.keyFile = writeFile(t, dir, "server-key.pem", key)
	f.caFile = writeFile(t, dir, "ca.pem", f.ca.pem)
	var err error
	c, k := f.ca.issue(t, "orders-service", x509.ExtKeyUsageClientAuth)
	if f.clientCert, err = tls.X509KeyPair(c, k); err != nil {
		t.Fatal(err)
	}
	c, k = f.rogue.issue(t, "intruder", x509.ExtKeyUsageClientAuth)
	if f.rogueCert, err = tls.X509KeyPair(c, k); err != nil {
		t.Fatal(err)
	}
	return f
}

// clientTLS trusts the test CA and presents certs.
func (f *tlsFixture) clientTLS(certs ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(f.ca.cert)
	return &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// health calls the health service over a fresh connection with creds.
func health(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// TestTLS: a TLS listener serves TLS clients that trust its CA, and refuses
// plaintext clients.
func TestTLS(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	cfg, err := guard.LoadTLSConfig(f.certFile, f.keyFile, "", nil)
	if err != nil {
		t.Fatalf("LoadTLSConfig: %v", err)
	}
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.TLS = cfg }, tls: f.clientTLS()})
	ns := e.newNamespace(r, "tls-", nil) // an admin call over TLS
	if err := upsertAs(admin(), r, ns, "a"); err != nil {
		t.Errorf("UpsertTask over TLS: %v", err)
	}
	if err := health(t, r.addr, insecure.NewCredentials()); codeOf(err) != codes.Unavailable {
		t.Errorf("plaintext client against a TLS listener: %v, want Unavailable", err)
	}
	untrusting := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}) // system roots only
	if err := health(t, r.addr, untrusting); codeOf(err) != codes.Unavailable {
		t.Errorf("client not trusting the CA: %v, want Unavailable", err)
	}
}

// TestMutualTLS: with a client CA, only clients presenting a certificate
// signed by it get in; a refused client fails at once with Unavailable (no
// wait for its deadline), and the server logs the refusal at WARN with the
// peer's address and the reason.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	cfg, err := guard.LoadTLSConfig(f.certFile, f.keyFile, f.caFile, nil)
	if err != nil {
		t.Fatalf("LoadTLSConfig: %v", err)
	}
	var logs testkit.SyncBuffer
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.TLS = cfg
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}, tls: f.clientTLS(f.clientCert)})
	if _, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: "mtls-x", Id: "x"}); codeOf(err) != codes.NotFound {
		t.Errorf("client with a certificate from the CA: %v, want NotFound (served)", err)
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":     credentials.NewTLS(f.clientTLS()),
		"certificate of a rogue CA": credentials.NewTLS(f.clientTLS(f.rogueCert)),
		"plaintext":                 insecure.NewCredentials(),
	} {
		if err := health(t, r.addr, creds); codeOf(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the handshake refused: Unavailable at once", name, err)
		}
	}
	want := regexp.MustCompile(`level=WARN msg="TLS handshake refused[^"]*" listener=grpc peer=127\.0\.0\.1:\d+ reason="?[^ ]*tls: `)
	testkit.Eventually(t, 30*time.Second, "a WARN line for the refused handshake, with the peer and the reason",
		func() bool { return want.MatchString(logs.String()) })
}

// TestLoadTLSConfigErrors: missing or wrong files are reported at start.
func TestLoadTLSConfigErrors(t *testing.T) {
	t.Parallel()
	f := newTLSFixture(t)
	dir := t.TempDir()
	junk := writeFile(t, dir, "junk.pem", []byte("not a pem"))
	for name, args := range map[string][3]string{
		"no key":           {f.certFile, "", ""},
		"missing cert":     {filepath.Join(dir, "nope.pem"), f.keyFile, ""},
		"key of no cert":   {f.certFile, junk, ""},
		"client CA junk":   {f.certFile, f.keyFile, junk},
		"client CA absent": {f.certFile, f.keyFile, filepath.Join(dir, "nope.pem")},
	} {
		if _, err := guard.LoadTLSConfig(args[0], args[1], args[2], nil); err == nil {
			t.Errorf("%s: LoadTLSConfig succeeded", name)
		}
	}
}
