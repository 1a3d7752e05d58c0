package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/exitcode"
)

// TestWorkerFromPulledRuntime: a worker host that holds nothing but what one `pipeline pull REF
// OUT --runtime DIR` fetched from a real registry (the output, runsc with its helpers, the
// rootfs) restores a set with the example worker and answers a call. A second pull into the
// same DIR fetches no runtime blob. A tag is refused (--runtime wants a digest); a DIR whose
// runsc was changed is refused by the worker, which does not run it, and by a pull; a runtime
// layer of other bytes is refused; DIR stays as it was, its whole tree.
func TestWorkerFromPulledRuntime(t *testing.T) {
	reg := testenv.StartRegistry(t, false)
	bins := t.TempDir()
	pipeline, worker := build(t, bins, "./cmd/pipeline"), build(t, bins, "./examples/worker")
	dir := testenv.WorkDir(t)
	_, config := captureSmall(t, pipeline, dir)
	tag := reg.Host + "/readie/runtime:v1"
	var pushed, pushLog bytes.Buffer
	push := testenv.Command(t, 5*time.Minute, pipeline, "push", "--runtime", "--config", config, tag)
	push.Stdout, push.Stderr = &pushed, &pushLog
	if err := push.Run(); err != nil {
		t.Fatalf("pipeline push: %v\n%s", err, &pushLog)
	}
	ref := strings.TrimSpace(pushed.String()) // by digest: pull --runtime takes no tag
	if !strings.HasPrefix(ref, reg.Host+"/readie/runtime@sha256:") {
		t.Fatalf("pipeline push printed %q, want the reference by digest", ref)
	}
	layoutDir := filepath.Join(dir, "layout")
	if output, err := testenv.Command(t, 5*time.Minute, pipeline, "push", "--runtime", "--config", config, "oci-layout:"+layoutDir+":v1").CombinedOutput(); err != nil {
		t.Fatalf("pipeline push to a layout: %v\n%s", err, output)
	}
	runscLayer, rootfsLayer := runtimeLayers(t, layoutDir)

	// The worker host: an empty directory, no config; pull as a host would, with its defaults.
	host := filepath.Join(dir, "host")
	os.Mkdir(host, 0o755)
	pull := func(out, runtime string, from string) (string, error) {
		cmd := testenv.Command(t, 5*time.Minute, pipeline, "pull", from, out, "--runtime", runtime)
		cmd.Dir = host
		output, err := cmd.CombinedOutput()
		return string(output), err
	}
	runtime := filepath.Join(host, "runtime")
	// A tag someone could move to another image (another runsc, run as root) is refused.
	output, err := pull(filepath.Join(host, "out"), runtime, tag)
	if code, _ := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(output, "name the image by its digest") {
		t.Errorf("pull --runtime of a tag: %v\n%s\nwant exit 2 asking for a digest", err, output)
	}
	if output, err := pull(filepath.Join(host, "out"), runtime, ref); err != nil {
		t.Fatalf("pipeline pull --runtime: %v\n%s", err, output)
	}
	if fi, err := os.Lstat(runtime); err != nil {
		t.Error(err)
	} else if fi.Mode() != os.ModeDir|0o700 {
		t.Errorf("the runtime directory is %s, want drwx------ (root runs what it holds)", fi.Mode())
	}
	for _, name := range []string{"runsc", "gvisor-bin/gvisor_sentry", "rootfs/usr/bin/python3"} {
		if _, err := os.Stat(filepath.Join(runtime, name)); err != nil {
			t.Errorf("the pulled runtime lacks %s: %v", name, err)
		}
	}
	// The worker runs where the build host's rootfs and runsc (with its helpers) are hidden
	// under empty directories (a mount namespace of its own): it has what the pull fetched.
	root := privateRoot(t, testenv.RunscPath(t), filepath.Join(dir, "worker"))
	var stdout, stderr bytes.Buffer
	cmd := testenv.Command(t, 2*time.Minute, "unshare", "--mount", "--propagation", "private", "sh", "-ec",
		`mount -t tmpfs none "$1"; mount -t tmpfs none "$2"; shift 2; exec "$@"`, "sh", testenv.Rootfs(t), filepath.Dir(testenv.RunscPath(t)),
		worker, "-out", filepath.Join(host, "out"), "-runtime", runtime, "-root", root, "-set", "small", "-eval", "sum(range(10))")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("worker -runtime: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "worker: small restored in") || !strings.Contains(stdout.String(), "worker: = 45") {
		t.Errorf("the worker on the pulled runtime did not restore and answer:\n%s", &stdout)
	}
	if strings.Contains(stderr.String(), "warning") {
		t.Errorf("the worker on the pulled runtime warned (a helper missing?):\n%s", &stderr)
	}
	testenv.CheckNoRunsc(t, testenv.RunscPath(t), root, "")
	for _, other := range []string{"-runsc", "-rootfs"} {
		output, err := testenv.Command(t, time.Minute, worker, "-out", filepath.Join(host, "out"), "-runtime", runtime, other, "/x").CombinedOutput()
		if code, _ := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(string(output), "-runtime DIR names runsc and the rootfs") {
			t.Errorf("worker -runtime with %s: %v\n%s\nwant exit 2 saying they exclude each other", other, err, output)
		}
	}

	// A second pull of the output into the same runtime directory fetches no runtime blob.
	logged := len(reg.Log())
	if output, err := pull(filepath.Join(host, "again"), runtime, ref); err != nil {
		t.Fatalf("second pull --runtime: %v\n%s", err, output)
	}
	for _, d := range []string{runscLayer, rootfsLayer} {
		if strings.Contains(reg.Log()[logged:], "/blobs/"+d) {
			t.Errorf("the second pull fetched runtime layer %s again:\n%s", d, reg.Log()[logged:])
		}
	}
	if !strings.Contains(reg.Log()[logged:], "GET /v2/readie/runtime/blobs/") {
		t.Fatalf("the registry log shows no blob fetch of the second pull: the check above proves nothing:\n%s", reg.Log()[logged:])
	}

	// A runtime directory whose runsc was changed: the worker refuses it without running it
	// (nor runsc --version), whatever -fallback says; a pull refuses it, and leaves it as it
	// was.
	ran := filepath.Join(dir, "runsc-ran")
	os.WriteFile(filepath.Join(runtime, "runsc"), []byte("#!/bin/sh\ntouch "+ran+"\n"), 0o755)
	refused, err := testenv.Command(t, time.Minute, worker, "-out", filepath.Join(host, "out"), "-runtime", runtime, "-root", root, "-set", "small", "-fallback", "cold").CombinedOutput()
	if code, _ := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(string(refused), "not the runtime the output was captured with: runsc is") {
		t.Errorf("worker -runtime of another runsc: %v\n%s\nwant exit 2 naming both digests", err, refused)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the worker ran a runsc of -runtime DIR that is not the output's")
	}
	before := testenv.ListTree(t, runtime)
	output, err = pull(filepath.Join(host, "third"), runtime, ref)
	if err == nil || !strings.Contains(output, "not the runtime the output was captured with: runsc") {
		t.Errorf("a pull into a runtime directory of another runsc: %v\n%s", err, output)
	}
	if after := testenv.ListTree(t, runtime); after != before {
		t.Errorf("a refused pull changed the runtime directory:\n%s\nthen\n%s", before, after)
	}
	if _, err := os.Stat(filepath.Join(host, "third")); err == nil {
		t.Error("a refused pull wrote the output")
	}

	// A runtime layer of other bytes (the layout's runsc blob holds the rootfs layer's) is
	// refused naming both digests; the runtime directory is not made, the output not written.
	data, err := os.ReadFile(filepath.Join(layoutDir, "blobs", "sha256", strings.TrimPrefix(rootfsLayer, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(layoutDir, "blobs", "sha256", strings.TrimPrefix(runscLayer, "sha256:")), data, 0o644)
	output, err = pull(filepath.Join(host, "forged"), filepath.Join(host, "forged-runtime"), "oci-layout:"+layoutDir+":v1")
	if err == nil || !strings.Contains(output, "expected "+runscLayer) || !strings.Contains(output, "got "+rootfsLayer) {
		t.Errorf("a pull of a forged runtime layer: %v\n%s", err, output)
	}
	for _, name := range []string{"forged", "forged-runtime"} {
		if _, err := os.Lstat(filepath.Join(host, name)); err == nil {
			t.Errorf("a refused pull left %s", name)
		}
	}
}

// runtimeLayers returns the digests of the runtime layers of the image in the OCI layout dir.
func runtimeLayers(t *testing.T, dir string) (runsc, rootfs string) {
	t.Helper()
	img, _ := ocitest.FirstImage(t, dir)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	runsc, rootfs = m.Annotations[output.AnnotationRuntimeRunsc], m.Annotations[output.AnnotationRuntimeRootfs]
	if runsc == "" || rootfs == "" {
		t.Fatalf("the pushed image has no runtime layers: %v", m.Annotations)
	}
	return runsc, rootfs
}
