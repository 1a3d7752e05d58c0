package launch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pycall"
)

// damagedOutput copies the example's output (a real capture of "small": json, email.parser)
// and cuts the copy's pages.img of "small" to half, leaving the manifest as it is.
func damagedOutput(t *testing.T) (out, rootfs, runscPath string) {
	t.Helper()
	testenv.SkipIfShort(t, "runsc and the rootfs")
	src, rootfs, runscPath, _, err := exampleOutput()
	if err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(t.TempDir(), "out")
	if err := testenv.CopyTree(src, out); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	c := m.Checkpoints[len(m.Checkpoints)-1]
	if c.ID != "small" {
		t.Fatalf("the example's last checkpoint is %s, not small", c.ID)
	}
	pages := filepath.Join(out, c.Dir, "pages.img")
	fi, err := os.Stat(pages)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(pages, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	return out, rootfs, runscPath
}

// TestColdFallback: a checkpoint whose pages.img was cut short is refused by its checks (its
// digest) and, with verification off, by its restore. Without the fallback either is a clear
// error; with it, the set starts cold, its modules loaded, and the report names the cause and
// the cost. Nothing is left: no sandbox, process or directory.
func TestColdFallback(t *testing.T) {
	out, rootfs, runscPath := damagedOutput(t)
	for _, tc := range []struct {
		name              string
		verify, fallback  bool
		noFallback        bool   // RestoreOptions.NoFallback: a warm pool's refill
		wantOpen, wantWhy string // what the open's error, and the cold start's cause, name
		wantFailure       string // what Restore's error names
	}{
		{name: "verified, no fallback", verify: true, wantOpen: "pages.img"},
		{name: "verified, fallback", verify: true, fallback: true, wantWhy: "pages.img"},
		{name: "verified, fallback, refused by the restore", verify: true, fallback: true, noFallback: true, wantFailure: "pages.img"},
		{name: "not verified, no fallback", wantFailure: "restore small into"},
		{name: "not verified, fallback", fallback: true, wantWhy: "restore small into"},
		{name: "not verified, fallback, refused by the restore", fallback: true, noFallback: true, wantFailure: "restore small into"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			output, err := launch.OpenOutput(out, launch.OpenOptions{Rootfs: rootfs, Verify: tc.verify, ColdFallback: tc.fallback})
			if tc.wantOpen != "" {
				if !errors.Is(err, launch.ErrOutput) || !errors.Is(err, manifest.ErrVerify) || !strings.Contains(err.Error(), tc.wantOpen) {
					t.Fatalf("OpenOutput = %v; want ErrOutput, ErrVerify naming %s", err, tc.wantOpen)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			rt := &launch.Runtime{Path: runscPath, Root: filepath.Join(dir, "root"), Flags: output.Flags}
			work, err := os.MkdirTemp("", "rfb-")
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				testenv.CheckNoRunsc(t, rt.Path, rt.Root, "rfb")
				testenv.CheckEmptyDir(t, work)
				os.RemoveAll(work)
				if err := testenv.RemoveRunscRoot(rt.Root); err != nil {
					t.Error(err)
				}
			}()
			r, err := output.Restorer(launch.Options{Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "rfb"}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			restored, err := r.Restore(ctx, "small", launch.RestoreOptions{NoFallback: tc.noFallback})
			if tc.wantFailure != "" {
				if err == nil {
					restored.Close(ctx)
					t.Fatalf("a checkpoint cut short restored (How %s)", restored.How)
				}
				if !strings.Contains(err.Error(), tc.wantFailure) {
					t.Errorf("Restore = %v; want a failure naming %q", err, tc.wantFailure)
				}
				return
			}
			if err != nil {
				t.Fatalf("Restore with the cold fallback = %v", err)
			}
			defer func() {
				if err := restored.Close(ctx); err != nil {
					t.Error(err)
				}
			}()
			if restored.How != launch.Cold || restored.Cold == nil || !strings.Contains(restored.Cold.Why.Error(), tc.wantWhy) || restored.Cold.Took <= 0 {
				t.Fatalf("How %s, Cold %+v; want a cold start whose cause names %q and its cost", restored.How, restored.Cold, tc.wantWhy)
			}
			request, err := pycall.EvalRequest(`[m in __import__("sys").modules for m in ("json", "email.parser")]`)
			if err != nil {
				t.Fatal(err)
			}
			response, err := restored.Call(ctx, request, pycall.SmallResponse)
			if err != nil {
				t.Fatal(err)
			}
			if v, err := pycall.DecodeEnvelope(response); err != nil || len(v.([]any)) != 2 || v.([]any)[0] != true || v.([]any)[1] != true {
				t.Errorf("the cold executor's modules = %s, %v; want json and email.parser loaded", pycall.Format(v, pycall.ErrorBytes), err)
			}
		})
	}
}
