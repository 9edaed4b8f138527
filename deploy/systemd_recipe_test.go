package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testkit"
)

// systemctlStandIn replaces systemctl where no systemd runs as PID 1 (a
// container, this test's mount namespace): daemon-reload has nothing to
// reload; enable --now enables the unit offline with the real systemctl
// (--root=/, the scratch /etc) and starts it as systemd would: ExecStart,
// as the unit's User and Group with their groups, with only the variables
// of its EnvironmentFile, in a session of its own, its output in
// $UNIT_LOG and its pid in $UNIT_PID. Anything else fails, naming itself.
const systemctlStandIn = `#!/bin/sh
set -eu
case "$*" in
daemon-reload) exit 0 ;;
"enable --now delayd"|"enable --now delayd.service") ;;
*) echo "systemctl stand-in: $* is not part of the recipe this test knows" >&2; exit 1 ;;
esac
unit=/etc/systemd/system/delayd.service
/usr/bin/systemctl --root=/ enable delayd.service
setting() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
user=$(setting User); group=$(setting Group); envfile=$(setting EnvironmentFile); exec_start=$(setting ExecStart)
[ -n "$user" ] && [ -n "$group" ] && [ -n "$envfile" ] && [ -n "$exec_start" ] || { echo "systemctl stand-in: $unit lacks User, Group, EnvironmentFile or ExecStart" >&2; exit 1; }
set --
while IFS= read -r line; do
	case "$line" in [A-Za-z_]*=*) set -- "$@" "$line" ;; esac
done < "$envfile"
setsid setpriv --reuid="$user" --regid="$group" --init-groups env -i "$@" $exec_start > "$UNIT_LOG" 2>&1 < /dev/null &
echo $! > "$UNIT_PID"
`

// TestSystemdRecipeOnBareHost (issue 41) runs deploy/systemd/README.md's
// install block as written, as root, in the directory a release tarball
// unpacks to (built by scripts/release-dir.sh, as make release builds it,
// around delayd and delayctl built from this tree), in a mount namespace
// whose /etc, /usr/local, /var and /home are scratch overlays of this
// host's: a bare host with no delayd user and no /etc/delayd, where the
// old recipe's `install ... /etc/delayd/delayd.env` failed. systemctl is
// the stand-in above; $EDITOR points the settings at a private Redis and
// free loopback ports. Then it checks what the recipe promises: the user
// and group, /etc/delayd 0750 and delayd.env 0640 root:delayd holding a
// fresh admin key that is no placeholder, the unit installed, enabled and
// passing systemd-analyze verify, `delayctl ready --wait` answered, and
// delayd serving as the unit's user with that admin key.
func TestSystemdRecipeOnBareHost(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the install recipe as root in a mount namespace of scratch overlays, so it needs root " +
			"(CI runs as root; here: sudo -E go test ./deploy -run TestSystemdRecipeOnBareHost)")
	}
	for _, tool := range []string{"unshare", "setpriv", "setsid", "openssl", "useradd", "groupadd", "systemctl", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (Debian: util-linux, openssl, passwd, systemd): %v", tool, err)
		}
	}

	// The release directory, as the tarball unpacks.
	work := worldReadableTempDir(t)
	rel := filepath.Join(work, "delayd-test-linux-amd64")
	if err := os.Mkdir(rel, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"github.com/delayd/delayd/cmd/delayd", "github.com/delayd/delayd/cmd/delayctl"} {
		copyFile(t, testkit.Build(t, pkg), filepath.Join(rel, filepath.Base(pkg)), 0o755)
	}
	testkit.Inputs(t, "..", "scripts/release-dir.sh", "deploy/systemd", "LICENSE", "README.md", "CHANGELOG.md")
	if out, err := exec.Command("../scripts/release-dir.sh", rel).CombinedOutput(); err != nil {
		t.Fatalf("scripts/release-dir.sh: %v\n%s", err, out)
	}
	recipe := recipeBlock(t, filepath.Join(rel, "systemd", "README.md"))

	// The operator's edit, and the stand-in for systemctl.
	rs := testkit.StartRedis(t)
	opsPort := testkit.FreePort(t)
	shim := filepath.Join(work, "shim")
	if err := os.Mkdir(shim, 0o755); err != nil {
		t.Fatal(err)
	}
	writeExec(t, filepath.Join(shim, "systemctl"), systemctlStandIn)
	editor := filepath.Join(work, "editor")
	writeExec(t, editor, fmt.Sprintf(`#!/bin/sh
# The operator's edit: a Redis of the test's own, loopback ports. The file
# is rewritten in place (same inode, mode and owner), as an editor saves it.
set -eu
sed -e 's|^DELAYD_REDIS_URL=.*|DELAYD_REDIS_URL=%s/0|' \
    -e 's|^DELAYD_LISTEN=.*|DELAYD_LISTEN=127.0.0.1:0|' \
    -e 's|^DELAYD_HTTP_LISTEN=.*|DELAYD_HTTP_LISTEN=127.0.0.1:0|' \
    -e 's|^DELAYD_OPS_LISTEN=.*|DELAYD_OPS_LISTEN=127.0.0.1:%d|' \
    -e 's|^DELAYD_LOG_FORMAT=.*|DELAYD_LOG_FORMAT=text|' "$1" > "$1.edit"
cat "$1.edit" > "$1" && rm "$1.edit"
`, rs.URL, opsPort))

	// The scratch host: overlays over the directories the recipe writes.
	var mounts strings.Builder
	for _, d := range []string{"/etc", "/usr/local", "/var", "/home"} {
		up, wk := filepath.Join(work, "upper", d), filepath.Join(work, "work", d)
		for _, p := range []string{up, wk} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&mounts, "mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s\n", d, up, wk, d)
	}
	unitLog, unitPID := filepath.Join(work, "delayd.log"), filepath.Join(work, "delayd.pid")
	script := mounts.String() + `
if getent passwd delayd >/dev/null || [ -e /etc/delayd ]; then echo "not a bare host: a delayd user or /etc/delayd exists"; exit 1; fi
cd ` + rel + `
set -e
` + recipe + `
set +e
echo "--- checks"
id delayd
stat -c 'mode %a %U:%G %n' /etc/delayd /etc/delayd/delayd.env /etc/systemd/system/delayd.service /usr/local/bin/delayd /usr/local/bin/delayctl
readlink /etc/systemd/system/multi-user.target.wants/delayd.service
echo "verify: $(systemd-analyze verify /etc/systemd/system/delayd.service 2>&1 || echo FAILED)"
echo "key: $(sed -n 's/^DELAYD_ADMIN_KEY=//p' /etc/delayd/delayd.env)"
`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--fork", "bash", "-c", script)
	cmd.Dir = work
	cmd.Env = []string{
		"PATH=" + shim + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"EDITOR=" + editor, "UNIT_LOG=" + unitLog, "UNIT_PID=" + unitPID, "HOME=/root", "LANG=C",
		// delayctl ready finds the ops listener as it does beside delayd.
		"DELAYD_OPS_LISTEN=127.0.0.1:" + strconv.Itoa(opsPort),
	}
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() {
		if b, err := os.ReadFile(unitPID); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(-pid, syscall.SIGKILL) // its session: setsid made it the leader
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(unitLog)
			t.Logf("delayd's log:\n%s", b)
		}
	})
	if err != nil {
		t.Fatalf("the recipe failed on a bare host: %v\n%s", err, out)
	}
	report := string(out)
	t.Logf("the recipe's run:\n%s", report)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^uid=\d+\(delayd\) gid=\d+\(delayd\) groups=\d+\(delayd\)$`),
		regexp.MustCompile(`(?m)^mode 750 root:delayd /etc/delayd$`),
		regexp.MustCompile(`(?m)^mode 640 root:delayd /etc/delayd/delayd.env$`),
		regexp.MustCompile(`(?m)^mode 644 root:root /etc/systemd/system/delayd.service$`),
		regexp.MustCompile(`(?m)^mode 755 root:root /usr/local/bin/delayd$`),
		regexp.MustCompile(`(?m)^mode 755 root:root /usr/local/bin/delayctl$`),
		regexp.MustCompile(`(?m)^/etc/systemd/system/delayd.service$`),
		regexp.MustCompile(`(?m)^verify: $`),
		regexp.MustCompile(`(?m)^ready$`), // delayctl ready --wait
	} {
		if !want.MatchString(report) {
			t.Errorf("after the recipe, no line matches %s:\n%s", want, report)
		}
	}
	m := regexp.MustCompile(`(?m)^key: (\S+)$`).FindStringSubmatch(report)
	if m == nil || len(m[1]) < 32 || strings.Contains(strings.ToUpper(m[1]), "CHANGE") {
		t.Fatalf("delayd.env's admin key is %v; want a fresh one of 32 characters or more:\n%s", m, report)
	}

	// delayd serves, as the unit's user, with the key the recipe wrote.
	var addr string
	testkit.Eventually(t, 30*time.Second, "delayd's serving line", func() bool {
		b, _ := os.ReadFile(unitLog)
		if s := servingText.FindSubmatch(b); s != nil {
			addr = string(s[1])
		}
		return addr != ""
	})
	cl, err := client.New(addr, client.WithAPIKey(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	who, err := cl.Admin().WhoAmI(ctx)
	if err != nil || !who.AuthEnabled || who.Key.ID != "admin-key" {
		t.Fatalf("WhoAmI with the recipe's admin key: %+v, %v", who, err)
	}
	b, _ := os.ReadFile(unitPID)
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	uid := regexp.MustCompile(`(?m)^Uid:\s+(\d+)`).FindSubmatch(status)
	if uid == nil || string(uid[1]) == "0" {
		t.Errorf("delayd runs as uid %s, want the delayd user's", uid)
	}
}

// servingText is the gRPC address in delayd's text "delayd serving" line.
var servingText = regexp.MustCompile(`msg="delayd serving" addr=(\S+)`)

// recipeBlock is the first sh block of the README's "## Install" section.
func recipeBlock(t *testing.T, readme string) string {
	t.Helper()
	raw, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(raw), "\n## Install\n")
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(sec)
	if !ok || m == nil {
		t.Fatalf("%s has no sh block under ## Install", readme)
	}
	return m[1]
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

func writeExec(t *testing.T, path, script string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}
