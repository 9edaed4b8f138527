package daemon

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// redisConn is the Redis a daemon uses and how to close it.
type redisConn struct {
	client redis.UniversalClient
	// embedded is the in-process store of embedded mode; nil otherwise.
	embedded *miniredis.Miniredis
	// stopTTL ends the embedded store's TTL clock (ttlClock), which closes
	// ttlDone.
	stopTTL, ttlDone chan struct{}
	// mode is "embedded", "redis" or "redis-cluster", for logs.
	mode string
	// where is the address or redacted URL, for logs (never a password).
	where string
}

// close closes the client, then the embedded store (clients before the
// server they talk to).
func (r *redisConn) close() error {
	err := r.client.Close()
	if r.embedded != nil {
		close(r.stopTTL)
		<-r.ttlDone
		r.embedded.Close()
	}
	return err
}

// openRedis connects to rawURL as Config.RedisURL documents; "" starts an
// embedded miniredis on a free loopback port. Every client honours context
// deadlines (go-redis ContextTimeoutEnabled), so the store's per-call
// timeout and a caller's own deadline bound each Redis call, not only the
// socket timeouts.
func openRedis(rawURL string) (*redisConn, error) {
	if rawURL == "" {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded store: %w", err)
		}
		r := &redisConn{
			client:   redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}),
			embedded: m,
			mode:     "embedded",
			where:    m.Addr(),
			stopTTL:  make(chan struct{}),
			ttlDone:  make(chan struct{}),
		}
		go r.ttlClock()
		return r, nil
	}
	if err := checkRedisURL(rawURL); err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case "redis-cluster", "rediss-cluster":
		opts, err := parseClusterURL(rawURL)
		if err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = true
		return &redisConn{client: redis.NewClusterClient(opts), mode: "redis-cluster", where: redact(rawURL)}, nil
	default:
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("redis url %s: %w", redact(rawURL), unwrapURLError(err))
		}
		opts.ContextTimeoutEnabled = true
		return &redisConn{client: redis.NewClient(opts), mode: "redis", where: redact(rawURL)}, nil
	}
}

// ttlClock tells the embedded store every second how much time passed:
// miniredis expires keys only when told (FastForward), and without it the
// keys delayd writes with a TTL (the records of pops, rate buckets) would
// stay for the life of the process. Wall clock: the store's TTLs are real
// time, as a Redis server's are.
func (r *redisConn) ttlClock() {
	defer close(r.ttlDone)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-r.stopTTL:
			return
		case now := <-t.C:
			r.embedded.FastForward(now.Sub(last))
			last = now
		}
	}
}

// redisSchemes are the schemes --redis-url takes, as an error lists them.
const redisSchemes = "redis://[user:pass@]host:port/db, rediss://… (TLS), unix:///path/to/redis.sock, " +
	"or redis-cluster://[user:pass@]h1:p1,h2:p2 / rediss-cluster://… for a Redis Cluster"

// checkRedisURL refuses a --redis-url without a scheme or with one delayd
// does not speak, saying what to write instead ("127.0.0.1:6379" would
// otherwise be a URL parser's "first path segment in URL cannot contain
// colon"). It never repeats a password.
func checkRedisURL(rawURL string) error {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		host := rawURL[strings.LastIndexByte(rawURL, '@')+1:] // without user:pass@
		if strings.ContainsAny(host, "/?") || host == "" {
			return fmt.Errorf("--redis-url (DELAYD_REDIS_URL) has no scheme; write one of %s", redisSchemes)
		}
		return fmt.Errorf("--redis-url (DELAYD_REDIS_URL) %q has no scheme: write redis://%s/0 (database 0; rediss:// for TLS), or one of %s",
			host, host, redisSchemes)
	}
	switch scheme {
	case "redis", "rediss", "unix", "redis-cluster", "rediss-cluster":
		return nil
	}
	return fmt.Errorf("--redis-url (DELAYD_REDIS_URL) %s: scheme %q is not one delayd speaks; write %s", redact(rawURL), scheme, redisSchemes)
}

// parseClusterURL turns redis-cluster://[user:pass@]h1:p1,h2:p2[?opts] into
// go-redis cluster options by rewriting it to the form
// redis.ParseClusterURL reads: redis://[user:pass@]h1:p1?addr=h2:p2&opts.
func parseClusterURL(rawURL string) (*redis.ClusterOptions, error) {
	scheme, rest, _ := strings.Cut(rawURL, "://")
	base := strings.TrimSuffix(scheme, "-cluster")
	authority, query, _ := strings.Cut(rest, "?")
	if i := strings.IndexByte(authority, '/'); i >= 0 {
		if p := authority[i:]; p != "/" && p != "/0" {
			return nil, fmt.Errorf("redis url %s: a cluster URL takes no database number (Redis Cluster has only db 0)", redact(rawURL))
		}
		authority = authority[:i]
	}
	userinfo := ""
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(authority, ",")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("redis url %s: %w", redact(rawURL), err)
	}
	for _, h := range hosts[1:] {
		if h == "" {
			return nil, fmt.Errorf("redis url %s: empty node address", redact(rawURL))
		}
		q.Add("addr", h)
	}
	if hosts[0] == "" {
		return nil, fmt.Errorf("redis url %s: no node address", redact(rawURL))
	}
	u := base + "://" + userinfo + hosts[0]
	if enc := q.Encode(); enc != "" {
		u += "?" + enc
	}
	opts, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, fmt.Errorf("redis url %s: %w", redact(rawURL), unwrapURLError(err))
	}
	return opts, nil
}

// redact returns rawURL with any password replaced by "xxxxx", for logs
// and errors.
func redact(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		user, _, hasPass := strings.Cut(authority[:i], ":")
		if hasPass {
			authority = user + ":xxxxx" + authority[i:]
		}
	}
	return scheme + "://" + authority + tail
}

// unwrapURLError drops the *url.Error layer, whose text repeats the whole
// URL, password included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
