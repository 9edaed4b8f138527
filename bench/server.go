package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/delayd/delayd/daemon"
)

// delayd is a delayd to drive: its address, how to read its CPU time and
// how to stop it.
type delayd struct {
	addr string
	// apiKey is the admin key delaybench started it with; "" for an
	// external delayd (then --api-key applies).
	apiKey string
	// pid is the child process's id; 0 if it is not a child.
	pid int
	// opsAddr is the child's ops listener (host:port) when its binary has
	// one (--ops-listen); "" otherwise.
	opsAddr string
	// cpu measures the process that runs delayd; nil if unknown.
	cpu func() (time.Duration, string, bool)
	// inProcess: delayd runs in this process (daemon.Start).
	inProcess bool
	// mysql sizes a durable delayd's database; nil in Redis-only mode.
	mysql *mysqlSizer
	stop  func(ctx context.Context) error
}

// procID is the process that runs this delayd: the child's (or the
// --target-pid), this process's when it runs in-process, 0 if unknown.
func (d *delayd) procID() int {
	if d.pid == 0 && d.inProcess {
		return os.Getpid()
	}
	return d.pid
}

// opsListen is the --ops-listen of the delayd under test: a free loopback
// port (metrics on, as in production), or "" with --no-ops.
func opsListen(cfg Config) string {
	if cfg.NoOps {
		return ""
	}
	return "127.0.0.1:0"
}

// startInProcess starts delayd in this process on a free loopback port,
// with authentication on (a fresh admin key), as in production. Its CPU
// cannot be told apart from the load generator's, so the figure covers both.
func startInProcess(ctx context.Context, redisURL, mysqlDSN, ops string, logger *slog.Logger) (*delayd, error) {
	key := randomSuffix(24)
	d, err := daemon.Start(ctx, daemon.Config{
		Listen:    "127.0.0.1:0",
		RedisURL:  redisURL,
		MySQLDSN:  mysqlDSN,
		AdminKey:  key,
		OpsListen: ops,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("start delayd in-process: %w", err)
	}
	// Durable mode serves only once its Redis index is complete.
	if err := waitServing(ctx, d.Addr(), nil); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(sctx)
		return nil, err
	}
	return &delayd{
		addr:      d.Addr(),
		apiKey:    key,
		inProcess: true,
		cpu: func() (time.Duration, string, bool) {
			return SelfCPU(), "delaybench process: in-process delayd + load generator", true
		},
		stop: d.Stop,
	}, nil
}

// buildDelayd builds ./cmd/delayd into dir and returns the binary's path.
// It must run from the module root (as `make bench` does).
func buildDelayd(ctx context.Context, dir string, stderr io.Writer) (string, error) {
	bin := filepath.Join(dir, "delayd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/delayd")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/delayd (run delaybench from the repository root, or pass --delayd-bin): %w", err)
	}
	return bin, nil
}

// startChild runs the delayd binary bin as a child process on a free
// loopback port, with authentication on (a fresh admin key, passed in the
// environment), and waits until its health service answers SERVING. Its CPU
// is read from /proc, so it excludes the load generator. logLevel is its
// --log-level ("" = its default). When the binary has an ops listener
// (--ops-listen), it is put on a free loopback port too, so that no two
// benchmark runs contend for its default port; noOps turns it off instead
// (an empty --ops-listen: no metrics, to measure what they cost).
func startChild(ctx context.Context, bin string, redisURL, mysqlDSN, logLevel string, noOps bool, extra []string, stderr io.Writer) (*delayd, error) {
	key := randomSuffix(24)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"--listen", addr, "--redis-url", redisURL}
	if logLevel != "" {
		args = append(args, "--log-level", logLevel)
	}
	opsAddr := ""
	switch {
	case noOps:
		args = append(args, "--ops-listen", "")
	case hasFlag(ctx, bin, "ops-listen"):
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		opsAddr = "127.0.0.1:" + strconv.Itoa(p)
		args = append(args, "--ops-listen", opsAddr)
	}
	if hasFlag(ctx, bin, "http-listen") {
		args = append(args, "--http-listen", "") // no HTTP edge: its default port is shared
	}
	if mysqlDSN != "" {
		args = append(args, "--mysql-dsn", mysqlDSN)
	}
	args = append(args, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DELAYD_ADMIN_KEY="+key)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	// exited is closed when the child has exited; waitErr is its status.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func(ctx context.Context) error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			var ee *exec.ExitError
			if errors.As(waitErr, &ee) {
				return fmt.Errorf("delayd exited: %w", waitErr)
			}
			return nil
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("delayd did not stop in time; killed")
		}
	}
	if err := waitServing(ctx, addr, exited); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stop(sctx)
		return nil, err
	}
	pid := cmd.Process.Pid
	return &delayd{
		addr:    addr,
		apiKey:  key,
		pid:     pid,
		opsAddr: opsAddr,
		cpu: func() (time.Duration, string, bool) {
			d, err := ProcCPU(pid)
			return d, "delayd child process", err == nil
		},
		stop: stop,
	}, nil
}

// hasFlag reports whether bin's --help lists --name.
func hasFlag(ctx context.Context, bin, name string) bool {
	out, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	return strings.Contains(string(out), "--"+name+" ")
}

// external is a delayd someone else runs at addr; pid, if non-zero, is its
// process on this host, for CPU figures.
func external(addr string, pid int) *delayd {
	d := &delayd{addr: addr, pid: pid, stop: func(context.Context) error { return nil }}
	if pid > 0 {
		d.cpu = func() (time.Duration, string, bool) {
			c, err := ProcCPU(pid)
			return c, "delayd process " + strconv.Itoa(pid), err == nil
		}
	}
	return d
}

// waitServing polls addr's health service until it answers SERVING, the
// process exits (exited is closed), or 60 s pass.
func waitServing(ctx context.Context, addr string, exited <-chan struct{}) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("delayd exited before serving (its log is shown with -v)")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("delayd at %s not serving after 60 s (last: %v)", addr, err)
		}
	}
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ownRedis is a redis-server this tool started for its own use.
type ownRedis struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startOwnRedis starts bin (redis-server) on a free loopback port with no
// persistence, so that measurements see no other client's load.
func startOwnRedis(ctx context.Context, bin string) (*ownRedis, error) {
	return startOwnRedisArgs(ctx, bin)
}

// startOwnRedisArgs is startOwnRedis with extra redis-server arguments, on
// a port below 55535 (so a cluster node's bus port, +10000, fits).
func startOwnRedisArgs(ctx context.Context, bin string, extra ...string) (*ownRedis, error) {
	port, err := freePort()
	for tries := 0; err == nil && port >= 55535 && tries < 100; tries++ {
		port, err = freePort()
	}
	if err != nil {
		return nil, err
	}
	if port >= 55535 {
		return nil, fmt.Errorf("no free loopback port below 55535")
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	r := &ownRedis{url: "redis://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
			return r, nil
		}
		if i > 100 {
			r.stop()
			return nil, fmt.Errorf("redis-server on port %d did not come up: %w", port, err)
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("redis-server exited at start (is %s installed?)", bin)
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop terminates the redis-server and waits for it.
func (r *ownRedis) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}
