package deploy_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// k8sObject is the part of a rendered Kubernetes object the checks read.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
}

type k8sSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a name or a number
	} `yaml:"httpGet"`
}

type k8sDeploymentSpec struct {
	Selector k8sSelector `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec k8sPodSpec `yaml:"spec"`
	} `yaml:"template"`
}

// k8sPodSpec is the part of a pod template the checks read.
type k8sPodSpec struct {
	TerminationGracePeriodSeconds int                 `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *k8sSecurityContext `yaml:"securityContext"`
	Containers                    []k8sContainer      `yaml:"containers"`
	Volumes                       []k8sVolume         `yaml:"volumes"`
}

// k8sSecurityContext holds the pod's or a container's user and groups (a
// container has no fsGroup or supplementalGroups).
type k8sSecurityContext struct {
	RunAsUser          *int64  `yaml:"runAsUser"`
	RunAsGroup         *int64  `yaml:"runAsGroup"`
	FSGroup            *int64  `yaml:"fsGroup"`
	SupplementalGroups []int64 `yaml:"supplementalGroups"`
}

type k8sContainer struct {
	Name            string              `yaml:"name"`
	Image           string              `yaml:"image"`
	ImagePullPolicy string              `yaml:"imagePullPolicy"`
	Command         []string            `yaml:"command"`
	Args            []string            `yaml:"args"`
	SecurityContext *k8sSecurityContext `yaml:"securityContext"`
	Env             []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

// k8sVolume is a pod volume; the checks know Secret and ConfigMap ones.
type k8sVolume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName   string `yaml:"secretName"`
		k8sKeyVolume `yaml:",inline"`
	} `yaml:"secret"`
	ConfigMap *struct {
		Name         string `yaml:"name"`
		k8sKeyVolume `yaml:",inline"`
	} `yaml:"configMap"`
}

// k8sKeyVolume is what Secret and ConfigMap volumes share: file modes and
// the keys projected (all of them when Items is empty).
type k8sKeyVolume struct {
	DefaultMode *int `yaml:"defaultMode"`
	Items       []struct {
		Key  string `yaml:"key"`
		Path string `yaml:"path"`
		Mode *int   `yaml:"mode"`
	} `yaml:"items"`
}

// kustomize returns the command line that renders a kustomization
// directory: kubectl's built-in kustomize, else a kustomize binary on PATH
// (scripts/ensure-kustomize.sh installs one into ./bin when kubectl is
// missing).
func kustomize(t *testing.T) []string {
	t.Helper()
	if p, err := exec.LookPath("kubectl"); err == nil {
		return []string{p, "kustomize"}
	}
	if p, err := exec.LookPath("kustomize"); err == nil {
		return []string{p, "build"}
	}
	t.Fatal("neither kubectl nor kustomize is on PATH: run scripts/ensure-kustomize.sh (make test does), " +
		"which installs kustomize into ./bin with go install")
	return nil
}

// TestKustomize renders every overlay of deploy/k8s with the real
// kustomize, as `kubectl apply -k` would, with admin-key and mysql-dsn files
// written the way deploy/k8s/README.md says, and checks what a cluster
// would run: every DELAYD_* variable and flag is one `delayd --help` lists,
// the probes hit the ops listener's port on /readyz and /healthz, the
// termination grace outlasts delayd's shutdown bound, the admin key comes
// from the Secret made from the file (no literal anywhere), the Service,
// PodDisruptionBudget and ServiceMonitor select the pods, each overlay is
// the mode it is named for, the image is pulled only if not present, and
// the PrometheusRule is deploy/prometheus/alerts.yml. (Whether the
// container's user can read what is mounted: TestKustomizeMountsReadable.)
func TestKustomize(t *testing.T) {
	t.Parallel()
	kz := kustomize(t)
	h := help(t)
	alerts := yamlFileNode(t, "prometheus/alerts.yml")

	const adminKey = "k8s-test-admin-key-0123456789abcdef"
	const dsn = "delayd:secret@tcp(mysql:3306)/delayd"
	modes := map[string]bool{}
	for _, mode := range overlayNames(t) {
		modes[mode] = true
		t.Run(mode, func(t *testing.T) {
			checkRendered(t, h, mode, renderOverlay(t, kz, mode, adminKey, dsn), alerts, adminKey, dsn)
		})
	}
	if !modes["redis-only"] || !modes["durable"] {
		t.Errorf("overlays %v, want redis-only and durable", sortedKeys(modes))
	}
}

// overlayNames are the directories of deploy/k8s/overlays.
func overlayNames(t *testing.T) []string {
	t.Helper()
	overlays, err := os.ReadDir("k8s/overlays")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range overlays {
		if o.IsDir() {
			names = append(names, o.Name())
		}
	}
	return names
}

// renderOverlay renders overlay name with kz from a copy of deploy/k8s,
// with the admin-key and mysql-dsn files written beside it the way
// deploy/k8s/README.md says, and returns the objects by "Kind/name".
func renderOverlay(t *testing.T, kz []string, name, adminKey, dsn string) map[string]k8sObject {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("k8s")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "overlays", name)
	writeFile(t, filepath.Join(dir, "admin-key"), adminKey+"\n")
	writeFile(t, filepath.Join(dir, "mysql-dsn"), dsn)
	cmd := exec.Command(kz[0], append(kz[1:], dir)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	return decodeObjects(t, out)
}

func checkRendered(t *testing.T, h delaydHelp, mode string, objs map[string]k8sObject, alerts *yaml.Node, adminKey, dsn string) {
	get := func(kind string) k8sObject {
		for _, o := range objs {
			if o.Kind == kind {
				return o
			}
		}
		t.Fatalf("no %s rendered", kind)
		return k8sObject{}
	}
	var dep k8sDeploymentSpec
	decodeSpec(t, get("Deployment"), &dep)
	pod := dep.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	h.checkArgs(t, "Deployment container", append(c.Command, c.Args...))
	// The image's tag (latest) would otherwise mean Always: a cluster that
	// has the image but no registry holding it would fail with ErrImagePull.
	if c.ImagePullPolicy != "IfNotPresent" {
		t.Errorf("imagePullPolicy %q, want IfNotPresent", c.ImagePullPolicy)
	}

	// Every variable the container gets: from envFrom ConfigMaps, and env.
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, ok := objs["ConfigMap/"+ef.ConfigMapRef.Name]
			if !ok {
				t.Fatalf("envFrom ConfigMap %q is not rendered", ef.ConfigMapRef.Name)
			}
			for k, v := range cm.Data {
				env[k] = v
			}
		case ef.SecretRef != nil:
			t.Errorf("envFrom Secret %q: its variables cannot be checked here; use env with secretKeyRef", ef.SecretRef.Name)
		}
	}
	secretEnv := map[string]string{} // variable -> decoded Secret value
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			secretEnv[e.Name] = secretValue(t, objs, ref.Name, ref.Key)
		}
	}
	h.checkEnv(t, "Deployment container", env)
	if _, ok := env["DELAYD_ADMIN_KEY"]; ok {
		t.Error("DELAYD_ADMIN_KEY is set in the environment: the key belongs in the Secret, read with DELAYD_ADMIN_KEY_FILE")
	}

	// The admin key: a file in a volume mounted from the generated Secret.
	keyFile := env["DELAYD_ADMIN_KEY_FILE"]
	var fromSecret bool
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(keyFile, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				if got := secretValue(t, objs, v.Secret.SecretName, rel); strings.TrimSpace(got) != adminKey {
					t.Errorf("DELAYD_ADMIN_KEY_FILE %s holds %q, want the admin-key file's %q", keyFile, got, adminKey)
				}
				fromSecret = true
			}
		}
	}
	if !fromSecret {
		t.Errorf("DELAYD_ADMIN_KEY_FILE %q is not a file of a mounted Secret volume", keyFile)
	}

	// The mode the overlay is named for.
	if env["DELAYD_REDIS_URL"] == "" {
		t.Error("DELAYD_REDIS_URL is not set: delayd would run the embedded in-memory store")
	}
	_, hasDSN := env["DELAYD_MYSQL_DSN"]
	switch mode {
	case "durable":
		if got := secretEnv["DELAYD_MYSQL_DSN"]; got != dsn {
			t.Errorf("DELAYD_MYSQL_DSN = %q from a Secret, want the mysql-dsn file's %q", got, dsn)
		}
	case "redis-only":
		if hasDSN {
			t.Errorf("redis-only sets DELAYD_MYSQL_DSN")
		}
	}

	// Probes on the ops listener's port; the listener reachable from the kubelet.
	_, opsPort, err := net.SplitHostPort(env["DELAYD_OPS_LISTEN"])
	if err != nil {
		t.Fatalf("DELAYD_OPS_LISTEN %q: %v", env["DELAYD_OPS_LISTEN"], err)
	}
	if host, _, _ := net.SplitHostPort(env["DELAYD_OPS_LISTEN"]); host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("DELAYD_OPS_LISTEN %q listens on %s only: the kubelet's probes cannot reach it", env["DELAYD_OPS_LISTEN"], host)
	}
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = strconv.Itoa(p.ContainerPort)
	}
	for _, p := range []struct {
		name, path string
		probe      *k8sProbe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if p.probe == nil {
			t.Errorf("no %s", p.name)
			continue
		}
		port := portOf(p.probe.HTTPGet.Port, ports)
		if port != opsPort || p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s GET %v%s (port %s), want %s on the ops listener's port %s", p.name, p.probe.HTTPGet.Port, p.probe.HTTPGet.Path, port, p.path, opsPort)
		}
	}
	for name, want := range map[string]string{"DELAYD_LISTEN": ports["grpc"], "DELAYD_HTTP_LISTEN": ports["http"]} {
		if _, port, _ := net.SplitHostPort(env[name]); port != want {
			t.Errorf("%s %q, but the container port it is published as is %q", name, env[name], want)
		}
	}

	// The grace period outlasts delayd's own bound on shutdown.
	shutdown, err := time.ParseDuration(env["DELAYD_SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatalf("DELAYD_SHUTDOWN_TIMEOUT %q: %v", env["DELAYD_SHUTDOWN_TIMEOUT"], err)
	}
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v does not exceed DELAYD_SHUTDOWN_TIMEOUT %v: SIGKILL would cut delayd's shutdown short", grace, shutdown)
	}

	// Everything that selects the pods selects them.
	podLabels := dep.Template.Metadata.Labels
	if !matches(dep.Selector.MatchLabels, podLabels) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", dep.Selector.MatchLabels, podLabels)
	}
	var svc struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	}
	svcObj := get("Service")
	decodeSpec(t, svcObj, &svc)
	if !matches(svc.Selector, podLabels) {
		t.Errorf("Service selector %v does not match the pod labels %v", svc.Selector, podLabels)
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Ports {
		svcPorts[p.Name] = true
		if portOf(p.TargetPort, ports) == "" {
			t.Errorf("Service port %s targets %v, which the container does not expose", p.Name, p.TargetPort)
		}
	}
	var pdb struct {
		Selector k8sSelector `yaml:"selector"`
	}
	decodeSpec(t, get("PodDisruptionBudget"), &pdb)
	if !matches(pdb.Selector.MatchLabels, podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not match the pod labels %v", pdb.Selector.MatchLabels, podLabels)
	}
	var sm struct {
		JobLabel  string      `yaml:"jobLabel"`
		Selector  k8sSelector `yaml:"selector"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
	}
	decodeSpec(t, get("ServiceMonitor"), &sm)
	if !matches(sm.Selector.MatchLabels, svcObj.Metadata.Labels) {
		t.Errorf("ServiceMonitor selector %v does not match the Service's labels %v", sm.Selector.MatchLabels, svcObj.Metadata.Labels)
	}
	if len(sm.Endpoints) != 1 || sm.Endpoints[0].Port != "ops" || !svcPorts["ops"] || sm.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want /metrics on the Service's ops port", sm.Endpoints)
	}
	if job := svcObj.Metadata.Labels[sm.JobLabel]; job != "delayd" {
		t.Errorf(`ServiceMonitor jobLabel %q gives job=%q; the alerts expect job="delayd"`, sm.JobLabel, job)
	}

	// The PrometheusRule is alerts.yml, rule for rule.
	rule := get("PrometheusRule")
	if diff := cmp.Diff(plain(t, alerts), plain(t, &rule.Spec)); diff != "" {
		t.Errorf("the PrometheusRule's spec differs from deploy/prometheus/alerts.yml (run make k8s-rules) (-alerts.yml +rendered):\n%s", diff)
	}
}

// decodeObjects splits kustomize's output into objects keyed "Kind/name".
func decodeObjects(t *testing.T, out []byte) map[string]k8sObject {
	t.Helper()
	objs := map[string]k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("kustomize output: %v", err)
		}
		objs[o.Kind+"/"+o.Metadata.Name] = o
	}
	return objs
}

func decodeSpec(t *testing.T, o k8sObject, into any) {
	t.Helper()
	if err := o.Spec.Decode(into); err != nil {
		t.Fatalf("%s %s spec: %v", o.Kind, o.Metadata.Name, err)
	}
}

func secretValue(t *testing.T, objs map[string]k8sObject, name, key string) string {
	t.Helper()
	s, ok := objs["Secret/"+name]
	if !ok {
		t.Fatalf("Secret %q is referenced but not rendered", name)
	}
	v, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(s.Data[key], "\n", ""))
	if err != nil || s.Data[key] == "" {
		t.Fatalf("Secret %s key %q: %q, %v", name, key, s.Data[key], err)
	}
	return string(v)
}

// portOf resolves a probe's or Service's port, a name or a number, to the
// container port number; "" when the container has no such port.
func portOf(p any, named map[string]string) string {
	switch p := p.(type) {
	case string:
		return named[p]
	case int:
		for _, n := range named {
			if n == strconv.Itoa(p) {
				return n
			}
		}
	}
	return ""
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func yamlFileNode(t *testing.T, path string) *yaml.Node {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &n
}

// plain decodes n into maps, slices and scalars, so two documents compare
// by content, not by comments or layout.
func plain(t *testing.T, n *yaml.Node) any {
	t.Helper()
	var v any
	if err := n.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
