package ctl_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delayd/delayd/ctl"
	"github.com/delayd/delayd/internal/testkit"
)

// TestHelpNeverShowsTheKey (issue 32 item 4): with DELAYD_API_KEY set,
// no help text and no usage error prints the key (the flag's default was
// the variable, so `delayctl --help` and a bare `delayctl ns` printed the
// whole secret); the help says the variable is set.
func TestHelpNeverShowsTheKey(t *testing.T) {
	t.Parallel()
	const secret = "dk_0123456789abcdef_SECRETSECRETSECRETSECRETSECRETSECRETSECRET1"
	env := map[string]string{"DELAYD_API_KEY": secret, "DELAYD_ADDR": "127.0.0.1:1"}
	for _, args := range [][]string{{"--help"}, {"ns"}, {"ns", "--help"}, {"key", "create", "--help"}, {"task", "upsert"}, {"--key"}} {
		var out, errOut testkit.SyncBuffer
		ctl.Main(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
		all := out.String() + errOut.String()
		if strings.Contains(all, "SECRETSECRET") {
			t.Errorf("delayctl %s prints the key:\n%s", strings.Join(args, " "), all)
		}
		if args[0] == "--help" && !strings.Contains(all, "DELAYD_API_KEY: set") {
			t.Errorf("delayctl --help does not say DELAYD_API_KEY is set:\n%s", all)
		}
	}
}

// TestKeyFile: --key-file (DELAYD_API_KEY_FILE) sends the file's key;
// with --key as well it is a usage error.
func TestKeyFile(t *testing.T) {
	t.Parallel()
	addr := delayd(t)
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{"whoami", "--key-file", file}, nil, 0, "admin-key"},
		{[]string{"whoami"}, map[string]string{"DELAYD_API_KEY_FILE": file}, 0, "admin-key"},
		{[]string{"whoami", "--key-file", file, "--key", adminKey}, nil, 2, "--key and --key-file"},
		{[]string{"whoami", "--key-file", filepath.Join(t.TempDir(), "none")}, nil, 2, "--key-file"},
	} {
		env := map[string]string{"DELAYD_ADDR": addr}
		for k, v := range c.env {
			env[k] = v
		}
		var out, errOut testkit.SyncBuffer
		code := ctl.Main(context.Background(), c.args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
		if all := out.String() + errOut.String(); code != c.code || !strings.Contains(all, c.want) {
			t.Errorf("delayctl %s (env %v): exit %d %q; want %d containing %q", strings.Join(c.args, " "), c.env, code, all, c.code, c.want)
		}
	}
}
