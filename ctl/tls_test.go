package ctl_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"github.com/delayd/delayd/internal/testkit"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/ctl"
	"github.com/delayd/delayd/daemon"
)

// TestTLSFlags: delayctl's TLS flags (and their environment variables)
// against a delayd that serves TLS and requires client certificates
// (mTLS), its certificate made out to a DNS name only, as behind a load
// balancer: --tls-ca verifies the server, --tls-server-name names it,
// --tls-cert/--tls-key are the client's; each missing piece is a non-zero
// exit saying what to check.
func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.pem)
	cert, key := ca.issue(t, "delayd.internal", x509.ExtKeyUsageServerAuth)
	srvCert, srvKey := write("server.pem", cert), write("server.key", key)
	cert, key = ca.issue(t, "operator", x509.ExtKeyUsageClientAuth)
	cliCert, cliKey := write("client.pem", cert), write("client.key", key)

	addr := delaydWith(t, daemon.Config{TLSCertFile: srvCert, TLSKeyFile: srvKey, TLSClientCAFile: caFile})
	ctx := t.Context()
	run := func(env map[string]string, args ...string) (stdout, stderr string, code int) {
		env["DELAYD_ADDR"], env["DELAYD_API_KEY"] = addr, adminKey
		var out, errOut testkit.SyncBuffer
		code = ctl.Main(ctx, args, func(k string) string { return env[k] }, nil, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	tlsArgs := []string{"--tls-ca", caFile, "--tls-server-name", "delayd.internal", "--tls-cert", cliCert, "--tls-key", cliKey}

	cases := []struct {
		name    string
		env     map[string]string
		args    []string
		code    int
		stderr  []string // each must appear in stderr
		listing bool     // stdout lists the namespaces
	}{
		{name: "all flags", args: append(append([]string{}, tlsArgs...), "ns", "list"), code: 0, listing: true},
		{name: "all from the environment", env: map[string]string{"DELAYD_TLS_CA": caFile, "DELAYD_TLS_SERVER_NAME": "delayd.internal",
			"DELAYD_TLS_CERT": cliCert, "DELAYD_TLS_KEY": cliKey}, args: []string{"ns", "list"}, code: 0, listing: true},
		{name: "plaintext against TLS", args: []string{"ns", "list"}, code: 1,
			stderr: []string{"delayctl: Unavailable:", "if it serves TLS, add --tls"}},
		{name: "no client certificate", args: []string{"--tls-ca", caFile, "--tls-server-name", "delayd.internal", "ns", "list"}, code: 1,
			stderr: []string{"delayctl: Unavailable:", "--tls-cert and --tls-key"}},
		{name: "the address is not the certificate's name", args: []string{"--tls-ca", caFile, "--tls-cert", cliCert, "--tls-key", cliKey, "ns", "list"}, code: 1,
			stderr: []string{"delayctl: Unavailable:", "does not name the host of", "--tls-server-name"}},
		{name: "system roots do not know the CA", args: []string{"--tls", "--tls-server-name", "delayd.internal", "--tls-cert", cliCert, "--tls-key", cliKey, "ns", "list"}, code: 1,
			stderr: []string{"delayctl: Unavailable:", "certificate signed by unknown authority", "pass the CA that signed it with --tls-ca"}},
		{name: "a certificate without its key", args: []string{"--tls-ca", caFile, "--tls-cert", cliCert, "ns", "list"}, code: 2,
			stderr: []string{"--tls-cert and --tls-key go together"}},
		{name: "a CA file without a certificate", args: []string{"--tls-ca", cliKey, "ns", "list"}, code: 2,
			stderr: []string{"no PEM certificate in it"}},
	}
	// A namespace for the listings to show.
	if out, errOut, code := run(map[string]string{}, append(append([]string{}, tlsArgs...), "ns", "create", "tls-ns")...); code != 0 {
		t.Fatalf("ns create over mTLS: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := c.env
			if env == nil {
				env = map[string]string{}
			}
			out, errOut, code := run(env, c.args...)
			if code != c.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, out, errOut)
			}
			for _, want := range c.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
			if c.listing != strings.Contains(out, "tls-ns") {
				t.Errorf("stdout lists tls-ns: %v, want %v:\n%s", !c.listing, c.listing, out)
			}
		})
	}
}

// testCA is a certificate authority made inside the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "delayctl test CA"},
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
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate for the DNS name (no IP address) and
// returns its PEM certificate and key.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{name},
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
