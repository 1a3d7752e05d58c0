package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/sandbox"
)

func TestExperimentCaptureRestore(t *testing.T) {
	rt := testenv.Runtime(t)
	rootfs := testenv.Rootfs(t)
	rt.DebugLogDir = "/tmp/rdebug"
	work := testenv.WorkDir(t)
	img := filepath.Join(work, "img")
	host := filepath.Join(work, "h1")
	os.MkdirAll(img, 0o755)
	os.MkdirAll(host, 0o755)
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeCapture, Rootfs: rootfs, HostDir: host, ImageDir: img, Imports: []string{"json"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := rt.NewSandbox("cap", work, host, spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	status, err := sb.Run(ctx)
	t.Logf("run: status %d err %v in %s", status, err, time.Since(start))
	if err := sb.Delete(ctx); err != nil {
		t.Error(err)
	}
	out, _ := os.ReadFile(sb.Stdout)
	errOut, _ := os.ReadFile(sb.Stderr)
	t.Logf("stdout: %s\nstderr: %s", out, errOut)
	entries, _ := os.ReadDir(img)
	for _, e := range entries {
		fi, _ := e.Info()
		t.Logf("%s %d", e.Name(), fi.Size())
	}
	host2 := filepath.Join(work, "h2")
	os.MkdirAll(host2, 0o755)
	spec2, _ := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeMeasure, Rootfs: rootfs, HostDir: host2})
	sb2, _ := rt.NewSandbox("m1", work, host2, spec2)
	start = time.Now()
	status, err = sb2.Restore(ctx, sandbox.RestoreOptions{ImageDir: img, Flags: []string{"-direct"}})
	t.Logf("restore: status %d err %v in %s", status, err, time.Since(start))
	sb2.Delete(ctx)
	errOut, _ = os.ReadFile(sb2.Stderr)
	t.Logf("stderr: %s", errOut)
	if !strings.Contains(string(errOut), "restored in measure mode") {
		t.Fatal("no restore")
	}
}
