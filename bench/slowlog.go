package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/bench/baseline"
	"github.com/delayd/delayd/storage/redisstore"
)

// slowlogMaxLen is the slowlog-max-len delaybench sets on its private
// Redis: room for every command of a phase (about 380 bytes each in
// Redis's memory), read and cleared at the phase's end. A phase that logs
// more loses its oldest entries; RedisCalls.Logged against the
// commandstats total then says how much of the phase the names cover.
const slowlogMaxLen = 1_000_000

// slowlog reads the SLOWLOG of one private redis-server that logs every
// command (slowlog-log-slower-than 0): each entry names the command, its
// first arguments (an EVALSHA's SHA, an FCALL's function) and the
// microseconds it took, and commands a script ran appear just before the
// script's own entry, from the client "?:0". It talks RESP over a
// connection of its own and parses the log as it streams, so a million
// entries cost a few megabytes of this process, not gigabytes. Not safe for
// concurrent use.
type slowlog struct {
	addr string
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

// dialSlowlog connects to the Redis at addr (host:port, no password: a
// server delaybench started).
func dialSlowlog(ctx context.Context, addr string) (*slowlog, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("slowlog: %w", err)
	}
	l := &slowlog{addr: addr, conn: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriter(c)}
	if err := l.do(ctx, "CLIENT", "SETNAME", "delaybench-probe"); err != nil {
		c.Close()
		return nil, err
	}
	if err := l.do(ctx, "CONFIG", "SET", "slowlog-max-len", strconv.Itoa(slowlogMaxLen)); err != nil {
		c.Close()
		return nil, err
	}
	return l, nil
}

// start logs every command from now on and clears the log; t gets the
// command statistics of that instant.
func (l *slowlog) start(ctx context.Context, t *slowlogTally) error {
	if err := l.do(ctx, "CONFIG", "SET", "slowlog-log-slower-than", "0"); err != nil {
		return err
	}
	return l.drain(ctx, nil, &slowlogTally{Commands: t.Commands})
}

// stop logs nothing any more and frees the log.
func (l *slowlog) stop(ctx context.Context) error {
	if err := l.do(ctx, "CONFIG", "SET", "slowlog-log-slower-than", "-1"); err != nil {
		return err
	}
	return l.do(ctx, "SLOWLOG", "RESET")
}

// close closes the connection.
func (l *slowlog) close() { l.conn.Close() }

// drain reads and clears the log and reads INFO commandstats, in one
// transaction (MULTI, INFO commandstats, SLOWLOG GET -1, SLOWLOG RESET,
// EXEC): no command runs between the three, so the statistics and the log
// cover the same commands. It adds the entries and the statistics to t.
// names maps an EVALSHA's SHA or an FCALL's function name to a script name.
func (l *slowlog) drain(ctx context.Context, names map[string]string, t *slowlogTally) error {
	l.deadline(ctx, 5*time.Minute)
	l.send("MULTI")
	l.send("INFO", "commandstats")
	l.send("SLOWLOG", "GET", "-1")
	l.send("SLOWLOG", "RESET")
	l.send("EXEC")
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("slowlog: %w", err)
	}
	for range 4 { // +OK, +QUEUED ×3
		if err := l.skip(); err != nil {
			return err
		}
	}
	if n, err := l.arrayLen(); err != nil || n != 3 {
		return fmt.Errorf("slowlog: EXEC answered %d replies, %v", n, err)
	}
	info, err := l.bulk()
	if err != nil {
		return err
	}
	if t.Commands == nil {
		t.Commands = map[string]CallStat{}
	}
	for k, v := range commandStats(parseInfo(info)) {
		s := t.Commands[k]
		t.Commands[k] = CallStat{Calls: s.Calls + v.Calls, Usec: s.Usec + v.Usec}
	}
	n, err := l.arrayLen()
	if err != nil {
		return err
	}
	t.names, t.cur = names, nil
	for range n {
		e, err := l.entry()
		if err != nil {
			return err
		}
		t.add(e)
	}
	return l.skip() // SLOWLOG RESET's +OK
}

// EnableSlowlog makes the probe read its server's SLOWLOG (every master's,
// on a cluster) between SlowlogStart and SlowlogStop: only for a server
// delaybench started, since it changes the server's slowlog settings and
// clears its log. names maps script SHAs and function names to script
// names. Call Close when done.
func (p *RedisProbe) EnableSlowlog(ctx context.Context, names map[string]string) error {
	p.names = names
	for _, n := range p.nodes {
		if err := n.EnableSlowlog(ctx, names); err != nil {
			return err
		}
	}
	if p.nodes != nil {
		return nil
	}
	c, ok := p.rdb.(*redis.Client)
	if !ok {
		return fmt.Errorf("slowlog: a %T is no single server", p.rdb)
	}
	l, err := dialSlowlog(ctx, c.Options().Addr)
	if err != nil {
		return err
	}
	p.log = l
	return nil
}

// Slowlog reports whether EnableSlowlog was called.
func (p *RedisProbe) Slowlog() bool {
	return p.log != nil || (p.nodes != nil && p.nodes[0].Slowlog())
}

// SlowlogStart logs every command from now on and clears the log; its
// tally holds the command statistics of that instant (nil unless
// EnableSlowlog was called).
func (p *RedisProbe) SlowlogStart(ctx context.Context) (*slowlogTally, error) {
	if !p.Slowlog() {
		return nil, nil
	}
	t := &slowlogTally{Commands: map[string]CallStat{}}
	err := p.eachLog(func(l *slowlog) error { return l.start(ctx, t) })
	return t, err
}

// SlowlogStop logs nothing any more and frees the log.
func (p *RedisProbe) SlowlogStop(ctx context.Context) error {
	return p.eachLog(func(l *slowlog) error { return l.stop(ctx) })
}

// SlowlogDrain reads and clears the log of every server: what ran since
// SlowlogStart or the last drain, with the command statistics at the
// drain. It returns nil without EnableSlowlog.
func (p *RedisProbe) SlowlogDrain(ctx context.Context) (*slowlogTally, error) {
	if !p.Slowlog() {
		return nil, nil
	}
	t := &slowlogTally{}
	err := p.eachLog(func(l *slowlog) error { return l.drain(ctx, p.names, t) })
	return t, err
}

// Close closes the slowlog connections.
func (p *RedisProbe) Close() {
	_ = p.eachLog(func(l *slowlog) error { l.close(); return nil })
}

func (p *RedisProbe) eachLog(f func(*slowlog) error) error {
	for _, n := range p.nodes {
		if err := n.eachLog(f); err != nil {
			return err
		}
	}
	if p.log == nil {
		return nil
	}
	return f(p.log)
}

// logEntry is what delaybench keeps of one slowlog entry.
type logEntry struct {
	usec int64
	// args are the first four arguments, the command name lower-cased.
	args []string
	// inScript: the command ran inside a script (client "?:0").
	inScript bool
}

// entry parses one entry: id, time, duration, arguments and, from Redis
// 4 on, the client's address and name.
func (l *slowlog) entry() (logEntry, error) {
	var e logEntry
	n, err := l.arrayLen()
	if err != nil {
		return e, err
	}
	if n < 4 {
		return e, fmt.Errorf("slowlog: an entry of %d fields", n)
	}
	if _, err := l.integer(); err != nil { // id
		return e, err
	}
	if _, err := l.integer(); err != nil { // unix time
		return e, err
	}
	if e.usec, err = l.integer(); err != nil {
		return e, err
	}
	argc, err := l.arrayLen()
	if err != nil {
		return e, err
	}
	for i := range argc {
		s, err := l.bulk()
		if err != nil {
			return e, err
		}
		if i < 4 {
			if i == 0 {
				s = strings.ToLower(s)
			}
			e.args = append(e.args, s)
		}
	}
	for i := int64(4); i < n; i++ {
		s, err := l.bulk()
		if err != nil {
			return e, err
		}
		if i == 4 {
			e.inScript = s == "?:0"
		}
	}
	return e, nil
}

// do sends one command and reads its reply, which must not be an error.
func (l *slowlog) do(ctx context.Context, args ...string) error {
	l.deadline(ctx, 30*time.Second)
	l.send(args...)
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("slowlog: %w", err)
	}
	if err := l.skip(); err != nil {
		return fmt.Errorf("slowlog: %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// deadline bounds the next exchange by ctx's deadline or limit.
func (l *slowlog) deadline(ctx context.Context, limit time.Duration) {
	d := time.Now().Add(limit)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	_ = l.conn.SetDeadline(d)
}

// send writes one command as a RESP array of bulk strings.
func (l *slowlog) send(args ...string) {
	fmt.Fprintf(l.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(l.w, "$%d\r\n%s\r\n", len(a), a)
	}
}

// line reads one CRLF-terminated line without the CRLF.
func (l *slowlog) line() (string, error) {
	s, err := l.r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("slowlog: read: %w", err)
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r")
	if s == "" {
		return "", errors.New("slowlog: empty reply line")
	}
	if s[0] == '-' {
		return "", fmt.Errorf("slowlog: redis: %s", s[1:])
	}
	return s, nil
}

// header reads a line of the given type and its integer.
func (l *slowlog) header(kind byte) (int64, error) {
	s, err := l.line()
	if err != nil {
		return 0, err
	}
	if s[0] != kind {
		return 0, fmt.Errorf("slowlog: got %q, want a %q reply", s, kind)
	}
	return strconv.ParseInt(s[1:], 10, 64)
}

func (l *slowlog) arrayLen() (int64, error) { return l.header('*') }
func (l *slowlog) integer() (int64, error)  { return l.header(':') }

// bulk reads a bulk string (a nil one as "").
func (l *slowlog) bulk() (string, error) {
	n, err := l.header('$')
	if err != nil || n < 0 {
		return "", err
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(l.r, b); err != nil {
		return "", fmt.Errorf("slowlog: read: %w", err)
	}
	return string(b[:n]), nil
}

// skip reads and discards one reply of any type.
func (l *slowlog) skip() error {
	s, err := l.line()
	if err != nil {
		return err
	}
	switch s[0] {
	case '+', ':':
		return nil
	case '$':
		n, err := strconv.ParseInt(s[1:], 10, 64)
		if err != nil || n < 0 {
			return err
		}
		_, err = l.r.Discard(int(n) + 2)
		return err
	case '*':
		n, err := strconv.ParseInt(s[1:], 10, 64)
		if err != nil {
			return err
		}
		for range n {
			if err := l.skip(); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("slowlog: unexpected reply %q", s)
}

// ScriptStat is what the calls of one script cost Redis over a phase.
type ScriptStat struct {
	CallStat
	// Inner counts the commands the script ran (redis.call), by command,
	// summed over its calls.
	Inner map[string]int64 `json:"inner,omitempty"`
	// InnerUsec is the time those commands took, part of Usec; the rest
	// is the Lua around them.
	InnerUsec int64 `json:"inner_usec"`
}

// slowlogTally adds up slowlog entries, which arrive newest first: the
// commands a script ran come right after (that is, before, in time) the
// script's own entry, since a script runs alone.
type slowlogTally struct {
	names map[string]string
	// Commands are INFO commandstats at the drain (summed over a
	// cluster's masters).
	Commands map[string]CallStat
	// Sent are the commands clients sent, by command (subcommands as
	// "config|set"), with script calls by script: "evalsha pop".
	Sent    map[string]CallStat
	Scripts map[string]*ScriptStat
	// Logged counts every entry but delaybench's own commands.
	Logged int64
	cur    *ScriptStat // the script whose inner commands come next
}

// unattributed holds commands that ran in a script whose own entry was not
// read (the log overflowed between them).
const unattributed = "(script not logged)"

func (t *slowlogTally) add(e logEntry) {
	if len(e.args) == 0 {
		return
	}
	cmd := commandKey(e.args)
	if probeCommands[cmd] {
		t.cur = nil
		return
	}
	t.Logged++
	if t.Sent == nil {
		t.Sent, t.Scripts = map[string]CallStat{}, map[string]*ScriptStat{}
	}
	if e.inScript {
		s := t.cur
		if s == nil {
			s = t.script(unattributed)
		}
		if s.Inner == nil {
			s.Inner = map[string]int64{}
		}
		s.Inner[cmd]++
		s.InnerUsec += e.usec
		return
	}
	t.cur = nil
	key := cmd
	if scriptCommands[cmd] {
		key = cmd + " " + scriptName(e.args, t.names)
		t.cur = t.script(key)
		t.cur.Calls++
		t.cur.Usec += e.usec
	}
	s := t.Sent[key]
	s.Calls++
	s.Usec += e.usec
	t.Sent[key] = s
}

func (t *slowlogTally) script(key string) *ScriptStat {
	s := t.Scripts[key]
	if s == nil {
		s = &ScriptStat{}
		t.Scripts[key] = s
	}
	return s
}

// containerCommands have subcommands, which INFO commandstats counts apart
// ("config|set"); commandKey names them the same way.
var containerCommands = map[string]bool{
	"acl": true, "client": true, "cluster": true, "command": true, "config": true, "function": true,
	"latency": true, "memory": true, "module": true, "object": true, "pubsub": true, "script": true,
	"slowlog": true, "xgroup": true, "xinfo": true,
}

// commandKey is the command of a slowlog entry as INFO commandstats names it.
func commandKey(args []string) string {
	if containerCommands[args[0]] && len(args) > 1 {
		return args[0] + "|" + strings.ToLower(args[1])
	}
	return args[0]
}

// scriptName names the script an EVALSHA or FCALL ran: by names (an
// EVALSHA's SHA, an FCALL's function name), else an FCALL's function name
// as sent, else "sha <first 8 hex digits>" with the shape of its first key
// (random parts in braces elided: asynq:{…}:scheduled). EVAL carries the
// source, which the log truncates: "(source)".
func scriptName(args []string, names map[string]string) string {
	if len(args) < 2 {
		return "?"
	}
	switch args[0] {
	case "eval", "eval_ro":
		return "(source)"
	case "fcall", "fcall_ro":
		if n, ok := names[args[1]]; ok {
			return n
		}
		return entryOfFunction(args[1])
	}
	sha := strings.ToLower(args[1])
	if n, ok := names[sha]; ok {
		return n
	}
	name := "sha " + sha[:min(8, len(sha))]
	if len(args) > 3 && args[2] != "0" {
		name += " " + keyShape(args[3])
	}
	return name
}

// entryOfFunction returns the entry of one of delayd's library functions
// of another build, delayd_<12 hex digits>_<entry> (docs/ARCHITECTURE.md,
// "The Lua library"), or fn itself.
func entryOfFunction(fn string) string {
	v, entry, ok := strings.Cut(strings.TrimPrefix(fn, "delayd_"), "_")
	if !ok || !strings.HasPrefix(fn, "delayd_") || len(v) != 12 || strings.Trim(v, "0123456789abcdef") != "" || entry == "" {
		return fn
	}
	return entry
}

// keyShape elides a key's hash tag (a run's random queue name) and what
// follows the segment after it (a task id): "asynq:{q1}:t:t42" →
// "asynq:{…}:t".
func keyShape(k string) string {
	i := strings.IndexByte(k, '{')
	j := strings.IndexByte(k, '}')
	if i < 0 || j < i {
		return k
	}
	rest := k[j+1:]
	if len(rest) > 1 && rest[0] == ':' {
		if n := strings.IndexByte(rest[1:], ':'); n >= 0 {
			rest = rest[:n+1]
		}
	}
	return k[:i+1] + "…}" + rest
}

// scriptNames names the scripts of delayd's store and of the source
// design by the SHA1 their EVALSHA sends.
func scriptNames() map[string]string {
	names := redisstore.ScriptNames()
	maps.Copy(names, baseline.ScriptNames())
	return names
}
