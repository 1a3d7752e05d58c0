package runsc_test

import (
	"context"
	"os/exec"
	"testing"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// BenchmarkState is one `runsc state` of a created sandbox through the driver beside the same
// command through a bare os/exec: what the driver adds to a command (its error log file, its
// process group, its error wrapping). Alternate them by running the test binary once per round.
func BenchmarkState(b *testing.B) {
	r := &runsc.Runsc{Path: testenv.RunscPath(b), Root: b.TempDir(), GlobalArgs: sandbox.DefaultFlags().Args()}
	defer testenv.RemoveRunscRoot(r.Root)
	work := testenv.WorkDir(b)
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: testenv.Rootfs(b), HostDir: work, Args: []string{"/bin/true"}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const id = "kit-bench"
	if err := r.Create(ctx, id, bundle(b, work, "b", spec), nil); err != nil {
		b.Fatal(err)
	}
	defer r.Delete(ctx, id, &runsc.DeleteOpts{Force: true})
	b.Run("driver", func(b *testing.B) {
		for b.Loop() {
			if _, err := r.State(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exec", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command(r.Path, append(append([]string{"--root=" + r.Root}, r.GlobalArgs...), "state", id)...).Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
