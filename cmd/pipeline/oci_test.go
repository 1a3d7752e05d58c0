package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/testenv"
)

// runProcess runs this test binary as the pipeline in a process of its own (its Docker config
// is read once per process) with env added, and returns its exit code, stdout and stderr.
func runProcess(t *testing.T, env map[string]string, limit time.Duration, args ...string) (int, string, string) {
	t.Helper()
	cmd := testenv.Command(t, limit+time.Minute, os.Args[0], args...) // the limit below says why first
	cmd.Env = append(os.Environ(), "READIE_TEST_AS_PIPELINE=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("pipeline %v did not finish within %s\n%s", args, limit, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// smallOutput captures one small set and returns its config.
func smallOutput(t *testing.T, dir string) string {
	t.Helper()
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: js\n    imports: [json]\n"}.write(t)
	if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
		t.Fatalf("capture: %s", stderr)
	}
	return cfg
}

func skopeo(t *testing.T, args ...string) string {
	t.Helper()
	out, err := testenv.Command(t, 2*time.Minute, "skopeo", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo %v: %v\n%s (make test installs Debian's skopeo)", args, err, out)
	}
	return string(out)
}

// TestPushPull: push to a real registry, inspect and copy it with skopeo (an independent
// client), pull it back from the registry and from skopeo's OCI layout; both verify and
// restore. A second push of the unchanged output uploads no blob; a push of another output
// captured with the same runsc and rootfs uploads its own blobs and no runtime blob.
func TestPushPull(t *testing.T) {
	t.Parallel()
	reg := testenv.StartRegistry(t, false)
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	ref := reg.Host + "/readie/checkpoints:v1"
	code, stdout, stderr := runCLI(t, "push", "--runtime", "--config", cfg, ref)
	if code != exitOK || !strings.HasPrefix(stdout, reg.Host+"/readie/checkpoints@sha256:") {
		t.Fatalf("push: exit %d\n%s%s", code, stdout, stderr)
	}
	digest := strings.TrimSpace(stdout[strings.Index(stdout, "@")+1:])
	uploads := reg.Uploads()
	if uploads < 3 {
		t.Fatalf("the registry saw %d uploads for a push of 3 layers and a config:\n%s", uploads, reg.Log())
	}

	var inspected struct{ Digest string }
	json.Unmarshal([]byte(skopeo(t, "inspect", "--tls-verify=false", "docker://"+ref)), &inspected)
	if inspected.Digest != digest {
		t.Errorf("skopeo sees %s, push printed %s", inspected.Digest, digest)
	}
	raw := rawManifest(t, ref)
	if raw.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(raw.Layers) != 5 ||
		raw.Annotations[output.AnnotationProtocol] != "2" || raw.Annotations["org.opencontainers.image.created"] == "" ||
		!strings.HasPrefix(raw.Annotations[output.AnnotationRootfsDigest], "sha256:") ||
		raw.Annotations[output.AnnotationRuntimeRunsc] != raw.Layers[3].Digest || raw.Annotations[output.AnnotationRuntimeRootfs] != raw.Layers[4].Digest {
		t.Errorf("image manifest: %+v", raw)
	}

	// Unchanged output: the same digest, nothing uploaded.
	if code, again, stderr := runCLI(t, "push", "--runtime", "--config", cfg, ref); code != exitOK || again != stdout {
		t.Fatalf("second push: exit %d\n%s%s", code, again, stderr)
	}
	if n := reg.Uploads(); n != uploads {
		t.Errorf("a second push of an unchanged output started %d uploads", n-uploads)
	}

	// Another output of the same runsc and rootfs: its own layers and config are uploaded, the
	// runtime's two layers are in the repository already. The first push's log shows what an
	// upload of a runtime layer looks like.
	runtimeDigests := []string{raw.Annotations[output.AnnotationRuntimeRunsc], raw.Annotations[output.AnnotationRuntimeRootfs]}
	uploadOf := func(digest string) string { return "digest=" + strings.Replace(digest, ":", "%3A", 1) }
	for _, d := range runtimeDigests {
		if !strings.Contains(reg.Log(), uploadOf(d)) {
			t.Fatalf("the first push did not upload runtime layer %s:\n%s", d, reg.Log())
		}
	}
	other := testenv.WorkDir(t)
	otherCfg := smallOutput(t, other)
	uploads, logged := reg.Uploads(), len(reg.Log())
	if code, stdout, stderr := runCLI(t, "push", "--runtime", "--config", otherCfg, reg.Host+"/readie/checkpoints:v2"); code != exitOK {
		t.Fatalf("push of another output: exit %d\n%s%s", code, stdout, stderr)
	}
	otherRaw := rawManifest(t, reg.Host+"/readie/checkpoints:v2")
	secondLog := reg.Log()[logged:]
	for _, d := range runtimeDigests {
		if strings.Contains(secondLog, uploadOf(d)) {
			t.Errorf("the push of another output on the same runtime uploaded runtime layer %s again", d)
		}
	}
	if n := reg.Uploads() - uploads; n == 0 || n > len(otherRaw.Layers)-2+1 {
		t.Errorf("the push of another output started %d uploads, want 1 to %d (its own layers and config)", n, len(otherRaw.Layers)-1)
	}
	for i, key := range []string{output.AnnotationRuntimeRunsc, output.AnnotationRuntimeRootfs} {
		if otherRaw.Annotations[key] != runtimeDigests[i] {
			t.Errorf("%s: %s for one output, %s for the other on the same runtime", key, runtimeDigests[i], otherRaw.Annotations[key])
		}
	}

	layoutDir := filepath.Join(dir, "layout")
	skopeo(t, "copy", "--src-tls-verify=false", "docker://"+ref, "oci:"+layoutDir+":v1")
	for _, src := range []string{ref, "oci-layout:" + layoutDir + ":v1", reg.Host + "/readie/checkpoints@" + digest} {
		pulled := filepath.Join(dir, "pulled-"+strings.NewReplacer("/", "-", ":", "-", "@", "-").Replace(src)[:20])
		if code, stdout, stderr := runCLI(t, "pull", "--config", cfg, src, pulled); code != exitOK {
			t.Fatalf("pull %s: exit %d\n%s%s", src, code, stdout, stderr)
		}
		if code, stdout, stderr := runCLI(t, "verify", "--config", cfg, "--out", pulled); code != exitOK {
			t.Fatalf("verify the pull of %s: %s%s", src, stdout, stderr)
		}
		if code, _, stderr := runCLI(t, "smoke", "--config", cfg, "--out", pulled); code != exitOK {
			t.Fatalf("restore the pull of %s: %s", src, stderr)
		}
	}

	// An OCI layout is a destination too.
	code, stdout, stderr = runCLI(t, "push", "--runtime", "--config", cfg, "oci-layout:"+filepath.Join(dir, "airgap")+":v1")
	if code != exitOK || !strings.HasSuffix(strings.TrimSpace(stdout), digest) {
		t.Fatalf("push to an OCI layout: exit %d, %s%s (want the registry's digest %s)", code, stdout, stderr, digest)
	}

	// Without --runtime the image holds the output alone (a push that cannot read the rootfs,
	// as in a pod of another user, still works).
	plain := reg.Host + "/readie/checkpoints:plain"
	code, plainRef, stderr := runCLI(t, "push", "--config", cfg, plain)
	if code != exitOK {
		t.Fatalf("push without --runtime: %s", stderr)
	}
	if raw := rawManifest(t, plain); len(raw.Layers) != 3 || raw.Annotations[output.AnnotationRuntimeRunsc] != "" || raw.Annotations[output.AnnotationRuntimeRootfs] != "" {
		t.Errorf("a push without --runtime: %+v", raw)
	}
	// pull --runtime of it says what is missing, and lays out nothing.
	runtimeDir := filepath.Join(dir, "runtime")
	code, _, stderr = runCLI(t, "pull", "--config", cfg, "--runtime", runtimeDir, strings.TrimSpace(plainRef), filepath.Join(dir, "plain-out"))
	if _, err := os.Stat(filepath.Join(runtimeDir, "runsc")); code == exitOK || !strings.Contains(stderr, "pushed without push --runtime") || err == nil {
		t.Errorf("pull --runtime of an image without the runtime: exit %d, runsc there: %v\n%s", code, err == nil, stderr)
	}
}

// imageManifest is what the tests read of a pushed image's manifest.
type imageManifest struct {
	MediaType   string
	Annotations map[string]string
	Layers      []struct{ MediaType, Digest string }
}

// rawManifest reads the manifest of the image ref of a loopback registry with skopeo.
func rawManifest(t *testing.T, ref string) imageManifest {
	t.Helper()
	var raw imageManifest
	if err := json.Unmarshal([]byte(skopeo(t, "inspect", "--raw", "--tls-verify=false", "docker://"+ref)), &raw); err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestPullRefusesAnotherProtocol: an image of another executor protocol is refused with the
// words a worker uses, and the output is not written.
func TestPullRefusesAnotherProtocol(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	img, _, err := output.Image(filepath.Join(dir, "out"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := img.Manifest()
	annotations := m.Annotations
	annotations[output.AnnotationProtocol] = "3"
	img = mutate.Annotations(img, annotations).(v1.Image)
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	pullRefused(t, cfg, "oci-layout:"+filepath.Join(dir, "layout"), filepath.Join(dir, "pulled"),
		"executor protocol 3, this worker implements 2; rebuild the worker image")
}

// pullRefused wants a pull of ref into pulled to fail (exit 1) with every one of words on
// stderr, and to leave pulled unwritten.
func pullRefused(t *testing.T, cfg, ref, pulled string, words ...string) {
	t.Helper()
	code, _, stderr := runCLI(t, "pull", "--config", cfg, ref, pulled)
	lacksOne := slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(stderr, w) })
	if code != exitFailed || lacksOne {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Error("a refused pull wrote the output")
	}
}

// TestPushUnreachableRegistry fails within the registry timeout, naming the host; exit 1.
func TestPushUnreachableRegistry(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	data, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(data), "runsc_command: 30s", "runsc_command: 30s\n  registry: 20s", 1)), 0o644)
	code, _, stderr := runProcess(t, nil, 2*time.Minute, "push", "--config", cfg, "127.0.0.1:1/readie/checkpoints:v1")
	if code != exitFailed || !strings.Contains(stderr, "registry 127.0.0.1:1") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
}

// TestRegistryAuth: a registry that requires a password refuses a push without credentials;
// with them (a Docker config, as every client reads) push and pull work, and the password is
// in no log line, output file, or layer of the pushed image.
func TestRegistryAuth(t *testing.T) {
	t.Parallel()
	reg := testenv.StartRegistry(t, true)
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	ref := reg.Host + "/readie/private:v1"
	env := map[string]string{"DOCKER_CONFIG": t.TempDir()} // empty: no credentials
	if code, _, stderr := runProcess(t, env, 2*time.Minute, "push", "--config", cfg, ref); code != exitFailed || !strings.Contains(stderr, "401 Unauthorized") {
		t.Fatalf("push without credentials: exit %d\n%s", code, stderr)
	}
	env["DOCKER_CONFIG"] = reg.DockerConfig(t)
	var said bytes.Buffer
	code, stdout, stderr := runProcess(t, env, 2*time.Minute, "push", "--config", cfg, "--log-format", "json", "-v", ref)
	said.WriteString(stdout + stderr)
	if code != exitOK {
		t.Fatalf("push with credentials: exit %d\n%s", code, stderr)
	}
	pulled := filepath.Join(dir, "pulled")
	code, stdout, stderr = runProcess(t, env, 2*time.Minute, "pull", "--config", cfg, "-v", ref, pulled)
	said.WriteString(stdout + stderr)
	if code != exitOK {
		t.Fatalf("pull with credentials: exit %d\n%s", code, stderr)
	}
	copied := filepath.Join(dir, "copied")
	skopeo(t, "copy", "--src-tls-verify=false", "--src-creds", reg.User+":"+reg.Password, "docker://"+ref, "oci:"+copied+":v1")
	if bytes.Contains(said.Bytes(), []byte(reg.Password)) {
		t.Error("the password is in what the pipeline printed")
	}
	var scanned int
	for _, root := range []string{filepath.Join(dir, "out"), pulled, copied} {
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, _ := os.ReadFile(path)
			scanned++
			if bytes.Contains(data, []byte(reg.Password)) {
				t.Errorf("%s holds the password", path)
			}
			return nil
		})
	}
	if scanned < 12 {
		t.Fatalf("scanned %d files", scanned)
	}
}
