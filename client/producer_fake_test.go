package client_test

// These tests pin down the client's own behaviour on the wire (retries,
// timeouts, metadata, TLS, batching) against a small TaskService that
// answers what the test scripts, over real gRPC on loopback. What delayd
// itself does is tested against a real server in client_test.go.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// scriptedTasks is a TaskService whose UpsertTask fails with the scripted
// codes in turn, then succeeds; it records what each call carried.
type scriptedTasks struct {
	delaydv1.UnimplementedTaskServiceServer

	mu       sync.Mutex
	failWith []codes.Code // consumed one per UpsertTask call
	block    bool         // UpsertTask waits for its context instead
	calls    atomic.Int32
	auth     []string      // authorization metadata per call
	deadline time.Duration // time left on the last call's deadline; 0 = none
	batches  []int         // BatchUpsertTasks sizes
}

func (s *scriptedTasks) UpsertTask(ctx context.Context, req *delaydv1.UpsertTaskRequest) (*delaydv1.UpsertTaskResponse, error) {
	s.calls.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.auth = append(s.auth, strings.Join(md.Get("authorization"), ","))
	if dl, ok := ctx.Deadline(); ok {
		s.deadline = time.Until(dl)
	}
	var code codes.Code
	if len(s.failWith) > 0 {
		code, s.failWith = s.failWith[0], s.failWith[1:]
	}
	block := s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if code != codes.OK {
		return nil, status.Error(code, "scripted failure")
	}
	return &delaydv1.UpsertTaskResponse{
		Task:    &delaydv1.Task{Namespace: req.GetNamespace(), Id: req.GetId(), Generation: 1, State: delaydv1.TaskState_TASK_STATE_SCHEDULED},
		Created: true,
	}, nil
}

func (s *scriptedTasks) BatchUpsertTasks(_ context.Context, req *delaydv1.BatchUpsertTasksRequest) (*delaydv1.BatchUpsertTasksResponse, error) {
	s.mu.Lock()
	s.batches = append(s.batches, len(req.GetTasks()))
	s.mu.Unlock()
	resp := &delaydv1.BatchUpsertTasksResponse{}
	for _, t := range req.GetTasks() {
		if t.GetWhen() == nil {
			resp.Results = append(resp.Results, &delaydv1.BatchUpsertTaskResult{
				Error: &delaydv1.ItemError{Code: int32(codes.InvalidArgument), Message: "when: due_time or delay is required"},
			})
			continue
		}
		resp.Results = append(resp.Results, &delaydv1.BatchUpsertTaskResult{Task: &delaydv1.Task{Id: t.GetId()}, Created: true})
	}
	return resp, nil
}

func (s *scriptedTasks) ListTasks(_ context.Context, req *delaydv1.ListTasksRequest) (*delaydv1.ListTasksResponse, error) {
	// 7 tasks t0..t6; the page token is the index to start at.
	start := 0
	if req.GetPageToken() != "" {
		fmt.Sscan(req.GetPageToken(), &start)
	}
	resp := &delaydv1.ListTasksResponse{}
	end := min(start+int(req.GetPageSize()), 7)
	for i := start; i < end; i++ {
		resp.Tasks = append(resp.Tasks, &delaydv1.Task{Id: fmt.Sprintf("t%d", i)})
	}
	if end < 7 {
		resp.NextPageToken = fmt.Sprint(end)
	}
	return resp, nil
}

// serveScripted serves s on a loopback port and returns its address.
func serveScripted(t *testing.T, s *scriptedTasks, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	delaydv1.RegisterTaskServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var fastRetry = client.RetryPolicy{MaxAttempts: 4, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

func TestRetriesUnavailableThenSucceeds(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{failWith: []codes.Code{codes.Unavailable, codes.Unavailable}}
	c := newClient(t, serveScripted(t, s), client.WithRetry(fastRetry))
	res, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
	if err != nil {
		t.Fatalf("Upsert after two Unavailable: %v", err)
	}
	if !res.Created || res.Task.ID != "a" {
		t.Errorf("result = %+v, want created task a", res)
	}
	if got := s.calls.Load(); got != 3 {
		t.Errorf("server saw %d calls, want 3 (two failures, one success)", got)
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{failWith: []codes.Code{codes.Unavailable, codes.Unavailable, codes.Unavailable, codes.Unavailable, codes.Unavailable, codes.Unavailable}}
	c := newClient(t, serveScripted(t, s), client.WithRetry(fastRetry))
	_, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Upsert error = %v, want Unavailable once retries are used up", err)
	}
	if got := s.calls.Load(); got != 4 {
		t.Errorf("server saw %d calls, want MaxAttempts = 4", got)
	}
}

func TestMoreThanFiveAttempts(t *testing.T) {
	t.Parallel()
	fail := make([]codes.Code, 10)
	for i := range fail {
		fail[i] = codes.Unavailable
	}
	s := &scriptedTasks{failWith: fail}
	p := fastRetry
	p.MaxAttempts = 7 // above grpc's default cap of 5
	c := newClient(t, serveScripted(t, s), client.WithRetry(p))
	_, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
	if status.Code(err) != codes.Unavailable || s.calls.Load() != 7 {
		t.Fatalf("error = %v after %d calls, want Unavailable after 7", err, s.calls.Load())
	}
}

func TestOnlyUnavailableIsRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.InvalidArgument, codes.ResourceExhausted, codes.Internal, codes.PermissionDenied} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			s := &scriptedTasks{failWith: []codes.Code{code}}
			c := newClient(t, serveScripted(t, s), client.WithRetry(fastRetry))
			_, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
			if status.Code(err) != code {
				t.Fatalf("error = %v, want %v", err, code)
			}
			if got := s.calls.Load(); got != 1 {
				t.Errorf("server saw %d calls, want 1: %v must not be retried", got, code)
			}
		})
	}
}

func TestRetryOff(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{failWith: []codes.Code{codes.Unavailable}}
	c := newClient(t, serveScripted(t, s), client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	_, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
	if status.Code(err) != codes.Unavailable || s.calls.Load() != 1 {
		t.Fatalf("error = %v after %d calls, want Unavailable after 1", err, s.calls.Load())
	}
}

func TestPerCallTimeout(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{block: true}
	c := newClient(t, serveScripted(t, s), client.WithTimeout(300*time.Millisecond))
	_, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("error = %v, want DeadlineExceeded from the client's timeout", err)
	}
	s.mu.Lock()
	left := s.deadline
	s.mu.Unlock()
	if left <= 0 || left > 300*time.Millisecond {
		t.Errorf("server saw %v left on the deadline, want within (0, 300ms]", left)
	}
}

func TestDefaultTimeoutIsSent(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{}
	c := newClient(t, serveScripted(t, s))
	if _, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	left := s.deadline
	s.mu.Unlock()
	if left <= 0 || left > client.DefaultTimeout {
		t.Errorf("server saw %v left on the deadline, want within (0, %v]", left, client.DefaultTimeout)
	}
}

func TestAPIKeyIsSentAsBearer(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{}
	c := newClient(t, serveScripted(t, s), client.WithAPIKey("dk_abc.secret"))
	if _, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.auth) != 1 || s.auth[0] != "Bearer dk_abc.secret" {
		t.Errorf("authorization metadata = %q, want [\"Bearer dk_abc.secret\"]", s.auth)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	s := &scriptedTasks{}
	addr := serveScripted(t, s, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))

	c := newClient(t, addr, client.WithTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"}))
	if _, err := c.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)}); err != nil {
		t.Fatalf("Upsert over TLS: %v", err)
	}

	// A plaintext client cannot talk to the TLS server.
	plain := newClient(t, addr, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}), client.WithTimeout(2*time.Second))
	if _, err := plain.Upsert(t.Context(), "ns", client.TaskSpec{ID: "a", When: client.After(time.Minute)}); err == nil {
		t.Fatal("plaintext Upsert against a TLS server succeeded")
	}
}

func TestUpsertNeedsWhen(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{}
	c := newClient(t, serveScripted(t, s))
	for name, spec := range map[string]client.TaskSpec{
		"zero When":      {ID: "a"},
		"negative delay": {ID: "a", When: client.After(-time.Second)},
	} {
		_, err := c.Upsert(t.Context(), "ns", spec)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "when") {
			t.Errorf("%s: error = %v, want InvalidArgument naming when", name, err)
		}
	}
	if s.calls.Load() != 0 {
		t.Errorf("server saw %d calls; a spec the client rejects must not be sent", s.calls.Load())
	}
}

func TestBatchUpsertSplitsAndReportsPerItem(t *testing.T) {
	t.Parallel()
	s := &scriptedTasks{}
	c := newClient(t, serveScripted(t, s))
	specs := make([]client.TaskSpec, 2500)
	for i := range specs {
		specs[i] = client.TaskSpec{ID: fmt.Sprintf("t%d", i), When: client.After(time.Minute)}
	}
	specs[1700].When = client.When{} // the server rejects this one item
	res, err := c.BatchUpsert(t.Context(), "ns", specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(specs) {
		t.Fatalf("%d results for %d specs", len(res), len(specs))
	}
	for i, r := range res {
		if i == 1700 {
			if status.Code(r.Err) != codes.InvalidArgument {
				t.Errorf("item 1700: Err = %v, want InvalidArgument", r.Err)
			}
			continue
		}
		if r.Err != nil || r.Task.ID != specs[i].ID {
			t.Fatalf("item %d = %+v, want task %s", i, r, specs[i].ID)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if fmt.Sprint(s.batches) != "[1000 1000 500]" {
		t.Errorf("calls carried %v tasks, want [1000 1000 500]", s.batches)
	}
}

func TestListIteratesPages(t *testing.T) {
	t.Parallel()
	c := newClient(t, serveScripted(t, &scriptedTasks{}))
	var ids []string
	for task, err := range c.List(t.Context(), "ns", client.ListOptions{PageSize: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	if got := strings.Join(ids, ","); got != "t0,t1,t2,t3,t4,t5,t6" {
		t.Errorf("List yielded %s, want t0..t6 across three pages", got)
	}
	// Breaking out early stops fetching.
	n := 0
	for range c.List(t.Context(), "ns", client.ListOptions{PageSize: 3}) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Errorf("early break: %d items", n)
	}
}

// selfSigned returns a certificate for localhost/127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
