package deploy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testkit"
)

// What the kubelet does with a Secret or ConfigMap volume (pkg/volume's
// atomic writer and SetVolumeOwnership), as far as who may read a file:
// each key is a file owned by root, with the item's mode or the volume's
// defaultMode (0644 when neither is given), inside a timestamped directory
// of mode 0755 that the ..data symlink and one symlink per key point into.
// With the pod's fsGroup set, every file's and directory's group becomes
// fsGroup and, the volume being read-only, its mode gains 0440; the
// container's process gets fsGroup (and supplementalGroups) as groups
// besides its runAsGroup.
const (
	kubeletDefaultMode = 0o644
	kubeletROMask      = 0o440
	kubeletDirMode     = 0o755
)

// podCredentials is who the container's process runs as.
type podCredentials struct {
	uid, gid uint32
	groups   []uint32 // supplementary: fsGroup, supplementalGroups
	fsGroup  *int64
}

// mountedFile is one file the kubelet would write into a volume.
type mountedFile struct {
	key  string // the Secret's or ConfigMap's key
	path string // its path in the volume
	data []byte
	mode os.FileMode
}

// TestKustomizeMountsReadable (issue 41) renders every overlay with the
// real kustomize and starts the delayd binary the way the kubelet would
// start the Deployment's container: as the manifest's runAsUser and
// runAsGroup, with fsGroup and supplementalGroups as its groups, against
// every mounted volume laid out as the kubelet writes it (owner root; the
// rendered defaultMode or item modes; group and mode as fsGroup changes
// them), its paths under a scratch root, the overlay's ConfigMap and
// Secret environment, a Redis of its own and, for the durable overlay, a
// MySQL database of its own. Every mounted file must be readable by that
// user, and delayd must start and accept the admin key from the mounted
// Secret. With the admin key mounted 0400 and no fsGroup (the manifests
// before the fix), delayd exited at once: "--admin-key-file: open ...:
// permission denied".
//
// It needs root: to create files owned by root and the pod's group, and
// to run delayd as another user.
func TestKustomizeMountsReadable(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test runs delayd as the manifests' user against root-owned files, so it needs root " +
			"(CI runs as root; here: sudo -E go test ./deploy -run TestKustomizeMountsReadable)")
	}
	kz := kustomize(t)
	bin := testkit.Build(t, "github.com/delayd/delayd/cmd/delayd")
	for _, mode := range overlayNames(t) {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const adminKey = "k8s-mounts-test-admin-key-0123456789abcdef"
			objs := renderOverlay(t, kz, mode, adminKey, "delayd:secret@tcp(mysql:3306)/delayd")
			var dep k8sDeploymentSpec
			for _, o := range objs {
				if o.Kind == "Deployment" {
					decodeSpec(t, o, &dep)
				}
			}
			pod := dep.Template.Spec
			if len(pod.Containers) != 1 {
				t.Fatalf("Deployment has %d containers, want 1", len(pod.Containers))
			}
			creds := credentialsOf(t, pod)
			root := worldReadableTempDir(t)
			files := mountVolumes(t, root, objs, pod, creds)
			for _, f := range files {
				readAs(t, creds, f)
			}
			startAsPod(t, bin, root, objs, pod, creds, adminKey)
		})
	}
}

// credentialsOf resolves the container's user, group and supplementary
// groups from the pod's and the container's securityContext, falling back
// to the image's USER (Dockerfile) as the runtime does.
func credentialsOf(t *testing.T, pod k8sPodSpec) podCredentials {
	t.Helper()
	imgUID, imgGID := imageUser(t)
	uid, gid := imgUID, imgGID
	psc, csc := pod.SecurityContext, pod.Containers[0].SecurityContext
	for _, sc := range []*k8sSecurityContext{psc, csc} { // the container's wins
		if sc == nil {
			continue
		}
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	c := podCredentials{uid: uint32(uid), gid: uint32(gid)}
	if psc != nil {
		c.fsGroup = psc.FSGroup
		if psc.FSGroup != nil {
			c.groups = append(c.groups, uint32(*psc.FSGroup))
		}
		for _, g := range psc.SupplementalGroups {
			c.groups = append(c.groups, uint32(g))
		}
	}
	if uid == 0 {
		t.Fatalf("the container runs as root (uid 0): the image's user %d is meant", imgUID)
	}
	return c
}

// imageUser is the Dockerfile's USER uid:gid.
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+):(\d+)\s*$`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("the Dockerfile has no USER uid:gid line")
	}
	uid, _ = strconv.ParseInt(string(m[1]), 10, 64)
	gid, _ = strconv.ParseInt(string(m[2]), 10, 64)
	return uid, gid
}

// worldReadableTempDir is a directory every user may traverse (t.TempDir
// is 0700, and its parents too), removed when the test ends.
func worldReadableTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "delayd-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// mountVolumes writes every volume the container mounts under root, at
// root+mountPath, as the kubelet writes it for creds, and returns the files
// by their user-visible paths.
func mountVolumes(t *testing.T, root string, objs map[string]k8sObject, pod k8sPodSpec, creds podCredentials) []mountedFile {
	t.Helper()
	var out []mountedFile
	for _, m := range pod.Containers[0].VolumeMounts {
		i := slices.IndexFunc(pod.Volumes, func(v k8sVolume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volumeMount %s names no volume", m.Name)
		}
		if m.SubPath != "" {
			t.Fatalf("volumeMount %s uses subPath: teach this test how the kubelet mounts one", m.Name)
		}
		files := volumeFiles(t, objs, pod.Volumes[i])
		dir := filepath.Join(root, m.MountPath)
		ts := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
		for _, d := range []string{dir, ts} {
			if err := os.MkdirAll(d, kubeletDirMode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		gid, orMask := 0, os.FileMode(0)
		if creds.fsGroup != nil {
			gid, orMask = int(*creds.fsGroup), kubeletROMask
		}
		for _, d := range []string{dir, ts} {
			chownMod(t, d, gid, (kubeletDirMode|orMask)|os.ModeDir)
		}
		for _, f := range files {
			p := filepath.Join(ts, f.path)
			if err := os.MkdirAll(filepath.Dir(p), kubeletDirMode); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, f.data, 0o600); err != nil {
				t.Fatal(err)
			}
			chownMod(t, p, gid, f.mode|orMask)
			top, _, _ := strings.Cut(f.path, "/")
			if err := os.Symlink(filepath.Join("..data", top), filepath.Join(dir, top)); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
			f.path = filepath.Join(dir, f.path)
			out = append(out, f)
		}
	}
	return out
}

func chownMod(t *testing.T, path string, gid int, mode os.FileMode) {
	t.Helper()
	if err := os.Chown(path, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode&os.ModePerm|mode&os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
}

// volumeFiles are the files of a Secret or ConfigMap volume, with the
// modes the rendered manifest gives them.
func volumeFiles(t *testing.T, objs map[string]k8sObject, v k8sVolume) []mountedFile {
	t.Helper()
	var src *k8sKeyVolume
	var data map[string][]byte
	switch {
	case v.Secret != nil:
		src = &v.Secret.k8sKeyVolume
		o, ok := objs["Secret/"+v.Secret.SecretName]
		if !ok {
			t.Fatalf("volume %s: Secret %q is not rendered", v.Name, v.Secret.SecretName)
		}
		data = map[string][]byte{}
		for k, val := range o.Data {
			b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(val, "\n", ""))
			if err != nil {
				t.Fatalf("Secret %s key %s: %v", v.Secret.SecretName, k, err)
			}
			data[k] = b
		}
	case v.ConfigMap != nil:
		src = &v.ConfigMap.k8sKeyVolume
		o, ok := objs["ConfigMap/"+v.ConfigMap.Name]
		if !ok {
			t.Fatalf("volume %s: ConfigMap %q is not rendered", v.Name, v.ConfigMap.Name)
		}
		data = map[string][]byte{}
		for k, val := range o.Data {
			data[k] = []byte(val)
		}
	default:
		t.Fatalf("volume %s is neither a Secret nor a ConfigMap: teach this test how the kubelet writes it", v.Name)
	}
	mode := os.FileMode(kubeletDefaultMode)
	if src.DefaultMode != nil {
		mode = os.FileMode(*src.DefaultMode)
	}
	var out []mountedFile
	if len(src.Items) == 0 {
		for _, k := range sortedKeys(data) {
			out = append(out, mountedFile{key: k, path: k, data: data[k], mode: mode})
		}
		return out
	}
	for _, it := range src.Items {
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		b, ok := data[it.Key]
		if !ok {
			t.Fatalf("volume %s: item key %q is not in its source", v.Name, it.Key)
		}
		out = append(out, mountedFile{key: it.Key, path: it.Path, data: b, mode: m})
	}
	return out
}

// readAs reads f as creds' user, through cat: a mounted file the
// container's user cannot read fails the test.
func readAs(t *testing.T, creds podCredentials, f mountedFile) {
	t.Helper()
	cmd := exec.Command("cat", f.path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: creds.uid, Gid: creds.gid, Groups: creds.groups}}
	out, err := cmd.Output()
	if err != nil || string(out) != string(f.data) {
		info, _ := os.Stat(f.path)
		st, _ := info.Sys().(*syscall.Stat_t)
		t.Errorf("uid %d gid %d groups %v cannot read the mounted %s (%s, owner %d:%d): %v",
			creds.uid, creds.gid, creds.groups, f.path, info.Mode(), st.Uid, st.Gid, err)
	}
}

// servingJSON is the gRPC address in delayd's JSON "delayd serving" line.
var servingJSON = regexp.MustCompile(`"msg":"delayd serving","addr":"([^"]+)"`)

// startAsPod runs bin as creds with the container's environment (paths
// under a mount moved under root; listeners on free loopback ports; the
// store addresses a test's own), waits until it serves, and checks that
// the admin key it read from the mounted Secret is the one the overlay's
// file holds.
func startAsPod(t *testing.T, bin, root string, objs map[string]k8sObject, pod k8sPodSpec, creds podCredentials, adminKey string) {
	t.Helper()
	c := pod.Containers[0]
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			for k, v := range objs["ConfigMap/"+ef.ConfigMapRef.Name].Data {
				env[k] = v
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			env[e.Name] = secretValue(t, objs, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	for k, v := range env {
		for _, m := range c.VolumeMounts {
			if v == m.MountPath || strings.HasPrefix(v, strings.TrimSuffix(m.MountPath, "/")+"/") {
				env[k] = filepath.Join(root, v)
			}
		}
	}
	env["DELAYD_LISTEN"], env["DELAYD_HTTP_LISTEN"], env["DELAYD_OPS_LISTEN"] = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	env["DELAYD_REDIS_URL"] = testkit.StartRedis(t).URL + "/0"
	if _, ok := env["DELAYD_MYSQL_DSN"]; ok {
		env["DELAYD_MYSQL_DSN"] = testkit.Database(t, "k8s")
	}

	cmd := exec.Command(bin, c.Args...)
	cmd.Dir = "/"
	for _, k := range sortedKeys(env) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: creds.uid, Gid: creds.gid, Groups: creds.groups}}
	var log testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if strings.Contains(log.String(), "WARNING: DATA RACE") {
			t.Errorf("delayd reported a data race:\n%s", log.String())
		}
	})
	var addr string
	testkit.Eventually(t, 60*time.Second, "delayd to serve as the pod's user", func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("delayd, run as uid %d gid %d groups %v with the overlay's mounts and environment, exited (%v):\n%s",
				creds.uid, creds.gid, creds.groups, err, log.String())
		default:
		}
		sc := bufio.NewScanner(strings.NewReader(log.String()))
		for sc.Scan() {
			if m := servingJSON.FindStringSubmatch(sc.Text()); m != nil {
				addr = m[1]
			}
		}
		return addr != ""
	})
	cl, err := client.New(addr, client.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	who, err := cl.Admin().WhoAmI(ctx)
	if err != nil || !who.AuthEnabled || who.Key.ID != "admin-key" {
		t.Fatalf("WhoAmI with the overlay's admin key: %+v, %v; want the bootstrap admin key, auth on\n%s", who, err, log.String())
	}
}
