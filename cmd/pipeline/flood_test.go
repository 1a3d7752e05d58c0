package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
)

// floodMiB is what the function of TestSandboxOutputBounded writes on the sandbox's stdout.
const floodMiB = 600

// floodRequest writes floodMiB MiB on the executor's own stdout (the sandbox's pipe, not the
// call's captured output: while a call runs the executor keeps the pipe's descriptor as the
// lowest one above 2 that gVisor shows as a host file, "host:[N]") and returns how many bytes
// it wrote.
var floodRequest = fmt.Sprintf(`(lambda os: (lambda f: sum(f.write(b"x" * 1048576) for _ in range(%d)) + (f.flush() or 0))(open(min(fd for fd in range(3, 256) if os.path.lexists("/proc/self/fd/%%d" %% fd) and os.readlink("/proc/self/fd/%%d" %% fd).startswith("host:")), "wb", closefd=False)))(__import__("os"))`, floodMiB)

// floodReport is what the flood child prints.
type floodReport struct {
	Wrote       int64  `json:"wrote"`
	TmpdirBytes int64  `json:"tmpdir_bytes"`
	StdoutLog   string `json:"stdout_log"` // its part that says what was dropped
}

// init runs this test binary as the pipeline's restore of a flooding function when
// READIE_TEST_FLOOD_CONFIG is set (TestSandboxOutputBounded), so that its memory is measured
// alone: restore the output's js checkpoint through the run package as measure and smoke do,
// call floodRequest, then report what TMPDIR holds before the scratch directory goes.
func init() {
	cfgPath := os.Getenv("READIE_TEST_FLOOD_CONFIG")
	if cfgPath == "" {
		return
	}
	if err := floodChild(cfgPath); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func floodChild(cfgPath string) error {
	cfg, err := config.Load(cfgPath, config.CacheDir())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	env, err := run.NewEnv(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer env.Close()
	request, err := pycall.EvalRequest(floodRequest)
	if err != nil {
		return err
	}
	var rep floodReport
	_, err = env.WithVerifiedOutput(ctx, cfg.Output, []string{"js"}, func(x *run.VerifiedOutput) error {
		r := x.Sandboxes.Restorer(x.Work, 4*time.Minute)
		_, err := r.TimedCall(ctx, launch.Call{SetID: "js", Step: "flood", Image: launch.Image{Dir: x.Dir(x.Picked[0]), Flags: r.Flags}, Request: request,
			Check: func(resp []byte) error {
				v, err := pycall.DecodeEnvelope(resp)
				rep.Wrote, _ = v.(int64)
				return err
			}})
		if err != nil {
			return err
		}
		return filepath.WalkDir(os.TempDir(), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rep.TmpdirBytes += fi.Size()
			if d.Name() == "stdout.log" {
				// Its start only, where the limit's note is: the child's memory is measured.
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				data, err := io.ReadAll(io.LimitReader(f, 9<<20))
				f.Close()
				if err != nil {
					return err
				}
				if i := bytes.Index(data, []byte("[readie:")); i >= 0 {
					rep.StdoutLog = string(data[i:min(len(data), i+200)])
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// TestSandboxOutputBounded: a function that writes 600 MiB on the sandbox's stdout leaves at
// most 16 MiB of it (limits.sandbox_output) in TMPDIR, says what it dropped in the log, and the
// pipeline's process stays under 300 MiB of RSS (its peak, from rusage).
func TestSandboxOutputBounded(t *testing.T) {
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Command(t, 6*time.Minute, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "READIE_TEST_FLOOD_CONFIG="+cfg, "TMPDIR="+tmp)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("flood child: %v\n%s", err, stderr.String())
	}
	var rep floodReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("flood child's report %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	if rep.Wrote != floodMiB<<20 {
		t.Fatalf("the function wrote %d bytes, want %d\n%s", rep.Wrote, floodMiB<<20, stderr.String())
	}
	if rep.TmpdirBytes > 64<<20 {
		t.Errorf("TMPDIR held %.1f MiB after a flood of %d MiB, want at most 64", float64(rep.TmpdirBytes)/(1<<20), floodMiB)
	}
	if !strings.Contains(rep.StdoutLog, "MiB of this sandbox's stdout dropped here; limits.sandbox_output") {
		t.Errorf("the stdout log does not say what it dropped: %q", rep.StdoutLog)
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
	t.Logf("flood of %d MiB: TMPDIR %.1f MiB, peak RSS %.1f MiB; %s", floodMiB, float64(rep.TmpdirBytes)/(1<<20), float64(rss)/(1<<20), rep.StdoutLog)
	if rss > 300<<20 {
		t.Errorf("the pipeline's peak RSS was %.1f MiB during the flood, want under 300", float64(rss)/(1<<20))
	}
}
