package launch_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

// limitedRestorer opens the example's output (a real capture) for a worker whose sandboxes
// have limits, with a runsc root and work directory of the test's own.
func limitedRestorer(t *testing.T, limits sandbox.Limits) (*launch.Restorer, *launch.Runtime, string) {
	t.Helper()
	output, runscPath, _ := openExample(t)
	dir, err := os.MkdirTemp("", "rlim-")
	if err != nil {
		t.Fatal(err)
	}
	rt := &launch.Runtime{Path: runscPath, Root: filepath.Join(dir, "root"), Flags: output.Flags}
	work := filepath.Join(dir, "w")
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, rt.Path, rt.Root, "rlim")
		testenv.CheckEmptyDir(t, work)
		if err := testenv.RemoveRunscRoot(rt.Root); err != nil {
			t.Error(err)
		}
		os.RemoveAll(dir)
	})
	r, err := output.Restorer(launch.Options{Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "rlim"}, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	return r, rt, work
}

// evalIn restores "small" and evaluates expr in it; the sandbox is deleted before it returns,
// and its cgroups with it.
func evalIn(t *testing.T, r *launch.Restorer, expr string) (any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	restored, err := r.Restore(ctx, "small", launch.RestoreOptions{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer func() {
		if err := restored.Close(ctx); err != nil {
			t.Error(err)
		}
		for _, controller := range []string{"memory", "pids"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", controller, restored.Sandbox.ID)); err == nil {
				t.Errorf("the %s cgroup of %s is left after Close", controller, restored.Sandbox.ID)
			}
		}
	}()
	request, err := pycall.EvalRequest(expr)
	if err != nil {
		t.Fatal(err)
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		return nil, err
	}
	return pycall.DecodeEnvelope(response)
}

// TestMemoryLimit: a restored sandbox limited to 100 MiB asked to fill 300 MB is ended by
// the OOM killer, and the call's error says so and names the limit; the next restore of the
// same restorer answers; nothing is left (no sandbox, process, directory or cgroup).
func TestMemoryLimit(t *testing.T) {
	r, _, _ := limitedRestorer(t, sandbox.Limits{Memory: 100 << 20})
	_, err := evalIn(t, r, `len(b"x" * (300 << 20))`)
	if !errors.Is(err, launch.ErrMemoryLimit) || !strings.Contains(err.Error(), "memory limit of 100MiB") {
		t.Fatalf("a call filling 300 MB in 100 MiB = %v; want ErrMemoryLimit naming 100MiB", err)
	}
	if v, err := evalIn(t, r, `len(b"x" * (10 << 20))`); err != nil || v != int64(10<<20) {
		t.Fatalf("the next call = %v, %v; want %d", v, err, 10<<20)
	}
}

// TestPidsLimit: a call that starts processes without end in a sandbox limited to 64 host
// tasks is stopped by the pids limit, and the error names it; the next call answers.
func TestPidsLimit(t *testing.T) {
	r, _, _ := limitedRestorer(t, sandbox.Limits{Pids: 64})
	_, err := evalIn(t, r, `[__import__("subprocess").Popen(["sleep", "600"]) for _ in range(500)]`)
	if !errors.Is(err, launch.ErrPidsLimit) || !strings.Contains(err.Error(), "pids limit of 64") {
		t.Fatalf("a call starting 500 processes under 64 pids = %v; want ErrPidsLimit naming 64", err)
	}
	if v, err := evalIn(t, r, `len([__import__("subprocess").run(["true"]) for _ in range(3)])`); err != nil || v != int64(3) {
		t.Fatalf("the next call = %v, %v; want 3", v, err)
	}
}

// TestNewSandboxLimits: a sandbox's limits are in its config.json's linux.resources, with the
// cgroups path runsc makes its cgroups at; limits that cannot bound a sandbox are refused by
// name, before anything is made on disk.
func TestNewSandboxLimits(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	o := f.Options(t, specs.User{})
	o.Limits = sandbox.Limits{Memory: 512 << 20, Pids: 256, CPUs: 2}
	sb, err := launch.NewSandbox(o, "set", "limits")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.Background())
	data, err := os.ReadFile(filepath.Join(sb.Bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	r := spec.Linux.Resources
	if r == nil || *r.Memory.Limit != 512<<20 || *r.Pids.Limit != 256 || *r.CPU.Quota != 200_000 || spec.Linux.CgroupsPath != "/"+sb.ID {
		t.Errorf("config.json's linux = %s; want the limits and cgroups path /%s", data, sb.ID)
	}

	o = f.Options(t, specs.User{})
	o.Limits = sandbox.Limits{Memory: 1 << 20}
	if _, err := launch.NewSandbox(o, "set", "refused"); !errors.Is(err, sandbox.ErrLimits) || !strings.Contains(err.Error(), "memory 1MiB") {
		t.Errorf("NewSandbox with 1 MiB = %v; want ErrLimits naming it", err)
	}
	testenv.CheckEmptyDir(t, o.WorkDir)
}
