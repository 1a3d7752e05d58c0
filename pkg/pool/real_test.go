package pool_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestRealPool restores two different checkpoints of one capture (one rootfs, one sandbox
// shape) through one pool of the real runsc: each answers with its modules imported and sees
// the environment its sandbox was created with, not the capture's, nor its bundle's as changed
// after the create. Then it kills every ready sandbox's process, as a crash would, and the
// pool hands out none of them but a new one that answers. testenv.Runtime checks that no
// sandbox is left under the root.
func TestRealPool(t *testing.T) {
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	rootfs := testenv.Rootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	version, err := rt.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sets := []struct {
		id      string
		imports []string
	}{{"json", []string{"json"}}, {"email", []string{"email.parser", "decimal"}}}
	for _, s := range sets {
		if _, err := capture.Run(ctx, rt, capture.Request{ID: s.id, Imports: s.imports, Rootfs: rootfs,
			Dir: filepath.Join(work, s.id), WorkDir: work, Timeout: 2 * time.Minute, RunscVersion: version}); err != nil {
			t.Fatal(err)
		}
	}

	token := "pool-" + strconv.Itoa(os.Getpid())
	l := &launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: filepath.Join(work, "p")}
	so := l.SandboxOptions(sandbox.ModeSandbox, []string{pycall.SmokeTokenVar + "=" + token}, nil)
	so.KeepLogs = false
	so.Output = testWriter{t}
	p, err := pool.New(ctx, pool.Options{
		New:  func() (*launch.Sandbox, error) { return launch.NewSandbox(so, "pool", "pooled") },
		Size: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}()
	call := func(set string, imports []string) {
		t.Helper()
		sb, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := sb.Delete(ctx); err != nil {
				t.Error(err)
			}
		}()
		// runsc restore onto a created sandbox uses the spec it was created with, not the
		// bundle's config.json as it is now: a token changed there is not what the executor sees.
		config := filepath.Join(sb.Bundle, "config.json")
		data, err := os.ReadFile(config)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(config, []byte(strings.ReplaceAll(string(data), token, "rewritten-after-create")), 0o600); err != nil {
			t.Fatal(err)
		}
		request, err := pycall.SmokeRequest(imports)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.CallOnce(ctx, launch.Image{Dir: filepath.Join(work, set)}, request, pycall.SmallResponse, func(response []byte) error {
			return pycall.CheckSmokeResponse(response, token)
		}); err != nil {
			t.Fatalf("%s restored into %s: %v", set, sb.ID, err)
		}
		t.Logf("%s restored into %s (created in %s ahead) answered", set, sb.ID, sb.CreateTime.Round(time.Millisecond))
	}
	for _, s := range sets {
		call(s.id, s.imports)
	}

	// The fault: every ready sandbox's process killed before it is used.
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	containers, err := rt.Driver().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var killed []string
	for _, c := range containers {
		if c.Status != "created" || c.Pid <= 0 {
			continue
		}
		if err := syscall.Kill(c.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed = append(killed, c.ID)
		testenv.WaitFor(t, "sandbox process "+strconv.Itoa(c.Pid)+" to die", func() bool {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(c.Pid) + "/stat")
			return err != nil || strings.Contains(string(data), ") Z ")
		})
	}
	if len(killed) != 2 {
		t.Fatalf("killed %v, want the 2 ready sandboxes (runsc list: %+v)", killed, containers)
	}
	call("email", sets[1].imports)
	if s := p.Stats(); s.Dead != 2 {
		t.Errorf("stats %+v, want the 2 killed found dead", s)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	containers, err = rt.Driver().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range containers {
		for _, id := range killed {
			if c.ID == id {
				t.Errorf("the killed sandbox %s was not deleted", id)
			}
		}
	}
}

// testWriter logs the executors' output through the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
