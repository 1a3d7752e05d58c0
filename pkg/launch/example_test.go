package launch_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
)

// TestMain leaves the runnable example out under -short, as testenv.SkipIfShort skips the
// tests that need runsc and the rootfs (an example cannot skip itself), and removes what the
// example's setup made.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		skip := flag.Lookup("test.skip").Value.String()
		if skip != "" {
			skip += "|"
		}
		flag.Set("test.skip", skip+"^ExampleRestorer_Restore$")
	}
	code := m.Run()
	if example.dir != "" {
		for _, root := range []string{"root", "worker-root"} {
			if err := testenv.RemoveRunscRoot(filepath.Join(example.dir, root)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}
		os.RemoveAll(example.dir)
	}
	os.Exit(code)
}

// example is what ExampleRestorer_Restore restores: an output the pipeline captured here,
// once.
var example struct {
	once                    sync.Once
	dir, out, rootfs, runsc string
	err                     error
}

// exampleOutput captures an output of one set, "small" (json, email.parser), as `pipeline capture` does
// (internal/run, with the real runsc and rootfs of READIE_RUNSC and READIE_ROOTFS), into a
// directory of its own, and gives a runsc root for the worker beside it; TestMain removes
// openExample opens the example's output (a real capture, made once per test binary) as a
// worker would, without verifying it; the test is skipped with -short.
func openExample(t *testing.T) (output *launch.Output, runscPath, root string) {
	t.Helper()
	testenv.SkipIfShort(t, "runsc and the rootfs")
	out, rootfs, runscPath, root, err := exampleOutput()
	if err != nil {
		t.Fatal(err)
	}
	if output, err = launch.OpenOutput(out, launch.OpenOptions{Rootfs: rootfs}); err != nil {
		t.Fatal(err)
	}
	return output, runscPath, root
}

// them.
func exampleOutput() (out, rootfs, runscPath, root string, err error) {
	example.once.Do(func() {
		example.runsc, example.rootfs = os.Getenv("READIE_RUNSC"), os.Getenv("READIE_ROOTFS")
		if example.runsc == "" || example.rootfs == "" {
			example.err = fmt.Errorf("READIE_RUNSC and READIE_ROOTFS are not set: run the tests with `make test`")
			return
		}
		if example.rootfs, example.err = filepath.EvalSymlinks(example.rootfs); example.err != nil {
			return
		}
		if example.dir, example.err = os.MkdirTemp("", "rdx-"); example.err != nil {
			return
		}
		example.out = filepath.Join(example.dir, "out")
		yaml := fmt.Sprintf("runsc:\n  path: %s\n  root: %s\nrootfs: %s\noutput: %s\ncheckpoint_cache: %s\nrestore_runs: 1\ncheckpoints:\n  - id: small\n    imports: [json, email.parser]\n",
			example.runsc, filepath.Join(example.dir, "root"), example.rootfs, example.out, filepath.Join(example.dir, "store"))
		cfg, err := config.Parse([]byte(yaml), "example.yaml", example.dir, filepath.Join(example.dir, "cache"))
		if err != nil {
			example.err = err
			return
		}
		log := logrus.New()
		log.SetOutput(io.Discard)
		env, err := run.NewEnv(context.Background(), cfg, log)
		if err != nil {
			example.err = err
			return
		}
		defer env.Close()
		sel, err := cfg.Select(nil, nil)
		if err != nil {
			example.err = err
			return
		}
		_, example.err = env.Capture(context.Background(), cfg.Output, run.CaptureOptions{Selection: sel})
	})
	return example.out, example.rootfs, example.runsc, filepath.Join(example.dir, "worker-root"), example.err
}

// A worker restores a checkpoint of an output someone else captured and pushed, and calls it,
// with pkg/launch (and, for sandboxes created ahead, pkg/pool). Every check a restore needs
// is the kit's: the worker's code holds none of its own.
func ExampleRestorer_Restore() {
	// An output this host pulled (OUT/manifest.json), this host's copy of its rootfs, runsc
	// and a runsc root private to the worker.
	out, rootfs, runscPath, root, err := exampleOutput()
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	// 1. Open the output, once: the manifest, its protocol, the runsc and restore flags against
	// the kit's allow-list, the rootfs this host restores onto against the manifest's digest,
	// every byte against the manifest, the restore spec and its user (launch.NewOutput).
	output, err := launch.OpenOutput(out, launch.OpenOptions{Rootfs: rootfs, Verify: true})
	if err != nil {
		fmt.Println(err) // launch.ErrOutput: bad input
		return
	}

	// 2. This host: its runsc (the exact version, the binary's sha256), the executor protocol,
	// the CPU features and cache line the checkpoint needs.
	work, err := os.MkdirTemp("", "rw-") // short (socket paths), only root's (mode 0700)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(work)
	rt := &launch.Runtime{Path: runscPath, Root: root, Flags: output.Flags}
	if _, err := output.CheckHost(ctx, rt, "small"); err != nil {
		fmt.Println(err) // launch.ErrHost; the warnings returned do not stop a restore
		return
	}

	// 3. A restorer: sandboxes in the work dir, named by random IDs (a runsc root of the
	// worker's own), with the environment the restored executor sees.
	r, err := output.Restorer(launch.Options{
		Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "worker"},
		Env: []string{"GREETING=hello"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// 4. Optionally, sandboxes created ahead: a restore then skips the sandbox's boot.
	p, err := pool.New(ctx, pool.Options{New: r.NewSandbox, Size: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close() // deletes every sandbox it made, a create under way included

	// 5. Restore, call, close: the sandbox is deleted on every path, and never used again.
	restored, err := r.Restore(ctx, "small", launch.RestoreOptions{Pool: p})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer restored.Close(ctx)
	request, err := pycall.EvalRequest(`__import__("os").environ["GREETING"] + ", json " + str("json" in __import__("sys").modules)`)
	if err != nil {
		fmt.Println(err)
		return
	}
	// An answer is a stranger's data: read no more of it than the call needs, and print what
	// it decodes to with pycall.Format, within a budget.
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		fmt.Println(err)
		return
	}
	value, err := pycall.DecodeEnvelope(response)
	fmt.Println(restored.How, pycall.Format(value, pycall.ErrorBytes), err)
	// Output: pool 'hello, json True' <nil>
}
