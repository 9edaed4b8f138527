package deploy_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	Healthcheck     struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Ports   []string `yaml:"ports"`
	Volumes []string `yaml:"volumes"`
}

var reComposeVar = regexp.MustCompile(`\$\{([A-Z0-9_]+)`)

// TestCompose checks deploy/compose/compose.yaml: two delayd replicas in
// durable mode with auth on, every DELAYD_* variable one delayd knows,
// every service health-checked (delayd's by delayctl ready), delayd given
// longer to stop than its shutdown bound, the stores on volumes, and every
// variable it reads from .env described in .env.example. (Nothing here
// runs docker compose config on it: the machines have no compose plugin.)
func TestCompose(t *testing.T) {
	raw, err := os.ReadFile("compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	h := help(t)

	var replicas []string
	hostPorts := map[string]string{}
	for _, name := range sortedKeys(f.Services) {
		s := f.Services[name]
		if len(s.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no health check", name)
		}
		for _, p := range s.Ports {
			host, _, _ := strings.Cut(p, ":")
			if other, dup := hostPorts[host]; dup {
				t.Errorf("host port %s published by both %s and %s", host, other, name)
			}
			hostPorts[host] = name
		}
		if !strings.Contains(s.Image, "DELAYD_IMAGE") {
			continue
		}
		replicas = append(replicas, name)
		h.checkEnv(t, "compose service "+name, s.Environment)
		h.checkArgs(t, "compose service "+name, s.Command)
		env := s.Environment
		if env["DELAYD_REDIS_URL"] == "" || env["DELAYD_MYSQL_DSN"] == "" {
			t.Errorf("%s: not durable mode (DELAYD_REDIS_URL %q, DELAYD_MYSQL_DSN %q)", name, env["DELAYD_REDIS_URL"], env["DELAYD_MYSQL_DSN"])
		}
		if !strings.HasPrefix(env["DELAYD_ADMIN_KEY"], "${DELAYD_ADMIN_KEY:?") {
			t.Errorf("%s: DELAYD_ADMIN_KEY %q, want it from .env, required (${DELAYD_ADMIN_KEY:?...})", name, env["DELAYD_ADMIN_KEY"])
		}
		if got := strings.Join(s.Healthcheck.Test, " "); !strings.HasPrefix(got, "CMD /usr/local/bin/delayctl ready") {
			t.Errorf("%s: health check %q, want delayctl ready (the image has no shell)", name, got)
		}
		shutdown, err1 := time.ParseDuration(env["DELAYD_SHUTDOWN_TIMEOUT"])
		grace, err2 := time.ParseDuration(s.StopGracePeriod)
		if err1 != nil || err2 != nil || grace <= shutdown {
			t.Errorf("%s: stop_grace_period %q must exceed DELAYD_SHUTDOWN_TIMEOUT %q, or docker stop kills delayd mid-shutdown", name, s.StopGracePeriod, env["DELAYD_SHUTDOWN_TIMEOUT"])
		}
		for _, dep := range []string{"redis", "mariadb"} {
			if s.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s: depends_on %s: condition %q, want service_healthy", name, dep, s.DependsOn[dep].Condition)
			}
		}
	}
	if len(replicas) != 2 {
		t.Errorf("delayd replicas %v, want 2", replicas)
	}
	for svc, dir := range map[string]string{"redis": "/data", "mariadb": "/var/lib/mysql"} {
		vols := f.Services[svc].Volumes
		if len(vols) != 1 || !strings.HasSuffix(vols[0], ":"+dir) {
			t.Errorf("%s: volumes %v, want a named volume on %s", svc, vols, dir)
			continue
		}
		if _, ok := f.Volumes[strings.Split(vols[0], ":")[0]]; !ok {
			t.Errorf("%s: volume %s is not declared under volumes:", svc, vols[0])
		}
	}

	example, err := os.ReadFile("compose/.env.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range reComposeVar.FindAllStringSubmatch(string(raw), -1) {
		if !regexp.MustCompile(`(?m)^#?` + m[1] + `=`).Match(example) {
			t.Errorf("compose.yaml reads ${%s}, which .env.example does not describe", m[1])
		}
	}
}
