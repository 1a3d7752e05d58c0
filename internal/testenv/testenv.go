// Package testenv gives integration tests the real runsc and the real executor rootfs. They
// are never skipped by `make test`: without them a test fails and says how to get them
// (`make test` builds both and sets READIE_RUNSC and READIE_ROOTFS). Only `go test -short`,
// the quick loop, skips the tests that need them.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

const (
	// BlockingModule never finishes importing (images/executor/testing): a capture of a set
	// that imports it is still running whenever a test times it out, signals or kills it, on
	// any machine, however fast.
	BlockingModule = "readie_test_block"
	// TestingPythonPath is where the image installs BlockingModule; it is on no interpreter's
	// path unless PYTHONPATH names it.
	TestingPythonPath = "/usr/lib/readie/testing"
)

// SkipIfShort skips the test under `go test -short`, naming what it needs that the quick loop
// goes without. `make test` never passes -short.
func SkipIfShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s", needs)
	}
}

// Rootfs returns the executor image's root filesystem.
func Rootfs(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the executor rootfs")
	path := os.Getenv("READIE_ROOTFS")
	if path == "" {
		t.Fatal("READIE_ROOTFS is not set: run the tests with `make test`, which builds the image")
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatalf("READIE_ROOTFS=%s: %v (run `make image`)", path, err)
	}
	info, err := manifest.ReadRootfsInfo(resolved)
	if err == nil {
		_, err = os.Stat(filepath.Join(resolved, info.SitePackages, "readie_executor/__main__.py"))
	}
	if err != nil {
		t.Fatalf("READIE_ROOTFS=%s holds no executor: %v (run `make image`)", path, err)
	}
	if _, err := os.Stat(filepath.Join(resolved, TestingPythonPath, BlockingModule+".py")); err != nil {
		t.Fatalf("READIE_ROOTFS=%s holds no %s: %v (run `make image`)", path, BlockingModule, err)
	}
	return resolved
}

// BlockedLine is what BlockingModule writes to the executor's stderr before it blocks.
const BlockedLine = "readie_test_block: blocking forever"

// WaitForBlocked waits until the capture sandbox id has imported BlockingModule (its stderr
// log, in its run's scratch directory under tmp, the run's TMPDIR, holds BlockedLine): from
// then on the executor writes nothing, so even a pipeline killed outright leaves it running.
func WaitForBlocked(t testing.TB, tmp, id string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	pattern := filepath.Join(tmp, "readie-scratch-*", id, "stderr.log")
	for {
		logs, _ := filepath.Glob(pattern)
		for _, log := range logs {
			if data, _ := os.ReadFile(log); strings.Contains(string(data), BlockedLine) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s did not reach %s within %s (%s)", id, BlockingModule, limit, pattern)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitForSandbox waits until a sandbox whose ID contains part runs under rt's root, and
// returns its ID: the state a test needs before it times out, signals or kills a run.
func WaitForSandbox(t testing.TB, rt *launch.Runtime, part string, limit time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		states, err := rt.States(ctx)
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		for id, state := range states {
			if strings.Contains(id, part) && state == "running" {
				return id
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no running sandbox named *%s* under %s within %s (last seen: %v)", part, rt.Root, limit, states)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RunscPath returns the pinned runsc binary.
func RunscPath(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "runsc")
	path := os.Getenv("READIE_RUNSC")
	if path == "" {
		t.Fatal("READIE_RUNSC is not set: run the tests with `make test`, which installs runsc")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("READIE_RUNSC=%s: %v (run `make runsc`)", path, err)
	}
	return path
}

// PipelineImage returns the OCI layout of the pipeline's own image (`make pipeline-image`).
func PipelineImage(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the pipeline's image")
	path := os.Getenv("READIE_PIPELINE_IMAGE")
	if path == "" {
		t.Fatal("READIE_PIPELINE_IMAGE is not set: run the tests with `make test`, which builds the pipeline's image")
	}
	if _, err := os.Stat(filepath.Join(path, "index.json")); err != nil {
		t.Fatalf("READIE_PIPELINE_IMAGE=%s holds no OCI layout: %v (run `make pipeline-image`)", path, err)
	}
	return path
}

// Runtime returns a runsc runtime with a private root and a lease of its own (a run's), which
// the test removes, after checking that no sandbox was left behind under it (CheckNoRunsc: in
// `runsc list` and by process).
func Runtime(t testing.TB) *launch.Runtime {
	t.Helper()
	root, err := os.MkdirTemp("", "readie-runsc-")
	if err != nil {
		t.Fatal(err)
	}
	l := Lease(t)
	rt := &launch.Runtime{
		Path:  RunscPath(t),
		Root:  root,
		Flags: sandbox.DefaultFlags(),
		Lease: l,
	}
	t.Cleanup(func() {
		CheckNoRunsc(t, rt.Path, root, "")
		if err := RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	return rt
}

// Lease returns a run's lease, released when the test ends.
func Lease(t testing.TB) *lease.Lease {
	t.Helper()
	l, err := lease.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Release(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// RemoveRunscRoot removes a runsc state root. runsc bind-mounts a null-netns file into its
// root and leaves it mounted (runs that share a root at once may stack one mount each), so the
// directory cannot be removed until every one is unmounted.
func RemoveRunscRoot(root string) error {
	netns := filepath.Join(root, "null-netns")
	for range 64 {
		err := syscall.Unmount(netns, syscall.MNT_DETACH)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return os.RemoveAll(root)
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", netns, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 64 unmounts", netns)
}

// WorkDir returns a short temporary directory: a Unix socket path must fit in 108 bytes.
func WorkDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdt-") // not readie-scratch-*: the pipeline sweeps those
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// Manifest loads the manifest.json of the output out, failing the test when it cannot.
func Manifest(t testing.TB, out string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
