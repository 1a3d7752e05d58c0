package importcost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/sandbox"
)

// starter starts the analysis's sandboxes: every one of the image's spec shape (network
// none, read-only root; the executor, or python3 -c in its place), bounded by a timeout and
// deleted on every path.
type starter struct {
	launcher launch.Launcher
	// started counts the sandboxes started: a second analysis of the same corpus starts none.
	started atomic.Int64
}

// importRun is one cold start of the executor whose first call imports preload, then module
// (nothing for ""), and reports on module's import. ColdMs is the cold start from `runsc
// create` to the answer.
type importRun struct {
	importResult
	ColdMs float64 `json:"cold_ms"`
}

func (s *starter) importOnce(ctx context.Context, step string, preload []string, module string) (importRun, error) {
	request, err := importRequest(preload, module)
	if err != nil {
		return importRun{}, err
	}
	s.started.Add(1)
	var res importResult
	// The zero Image: `runsc create` and `runsc start`, both on the clock.
	marks, err := s.launcher.TimedCall(ctx, launch.Call{SetID: "analyze", Step: step, Request: request, Check: func(response []byte) error {
		var err error
		res, err = decodeImport(response)
		return err
	}, MaxResponseSize: importResponseSize})
	if err != nil {
		what := "the bare executor"
		if module != "" {
			what = module
		}
		return importRun{}, fmt.Errorf("%s of %s: %w", step, what, err)
	}
	return importRun{importResult: res, ColdMs: marks.TotalMS()}, nil
}

// pooledOnce starts the bare executor in a sandbox that `runsc create` made first, off the
// clock, as a pool's are: restored from imageDir with flags, or started cold when imageDir is
// "". The time runs from `runsc restore` (or `runsc start`) to the answer of a call that imports
// nothing, the call of the cold start's figure. A restore's memory is read once it answered,
// idle, off the clock (zero for a cold start: not a checkpoint's).
func (s *starter) pooledOnce(ctx context.Context, imageDir string, flags []string) (float64, launch.Memory, error) {
	request, err := importRequest(nil, "")
	if err != nil {
		return 0, launch.Memory{}, err
	}
	step := "pooled-cold"
	var memory launch.Memory
	var inspect func(*launch.Sandbox) error
	if imageDir != "" {
		step = "pooled"
		inspect = func(sb *launch.Sandbox) (err error) { memory, err = sb.Memory(); return err }
	}
	s.started.Add(1)
	marks, err := s.launcher.TimedCall(ctx, launch.Call{SetID: "analyze", Step: step,
		Prepare: func(ctx context.Context, sb *launch.Sandbox) error { return sb.Create(ctx) },
		Image:   launch.Image{Dir: imageDir, Flags: flags}, Request: request, Check: func(response []byte) error {
			res, err := decodeImport(response)
			if err == nil && res.Error != "" {
				err = fmt.Errorf("the bare call failed: %s", res.Error)
			}
			return err
		}, MaxResponseSize: importResponseSize, Inspect: inspect})
	if err != nil {
		return 0, launch.Memory{}, fmt.Errorf("%s start: %w", step, err)
	}
	return marks.TotalMS(), memory, nil
}

// probeResult is what the resolve probe learnt about the image.
type probeResult struct {
	Stdlib  []string
	Modules map[string]bool
	// Errors say why a candidate is not a module, when finding it raised.
	Errors map[string]string
}

// resolve asks the image which candidates are modules, in one sandbox running python3 -c. A
// candidate whose probe kills or hangs the interpreter is marked not a module (with why), and
// the probe runs again for the ones after it; at most one sandbox per such candidate.
func (s *starter) resolve(ctx context.Context, candidates []string) (*probeResult, error) {
	res := &probeResult{Modules: map[string]bool{}, Errors: map[string]string{}}
	todo := candidates
	for first := true; first || len(todo) > 0; first = false {
		out, runErr, err := s.runPython(ctx, "resolve", resolveScript, todo)
		if err != nil {
			return nil, err
		}
		asked, answered := "", map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(line, "stdlib "):
				res.Stdlib = strings.Fields(strings.TrimPrefix(line, "stdlib "))
			case strings.HasPrefix(line, "? "):
				asked = strings.TrimPrefix(line, "? ")
			case strings.HasPrefix(line, "= "):
				fields := strings.SplitN(strings.TrimPrefix(line, "= "), " ", 3)
				if len(fields) < 2 {
					continue
				}
				answered[fields[0]] = true
				res.Modules[fields[0]] = fields[1] == "1"
				if len(fields) == 3 && fields[2] != "" {
					res.Errors[fields[0]] = fields[2]
				}
			}
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if res.Stdlib == nil {
			return nil, fmt.Errorf("the image's python3 did not start: %w", errors.Join(runErr, errors.New("no stdlib line")))
		}
		var rest []string
		for _, c := range todo {
			if !answered[c] {
				rest = append(rest, c)
			}
		}
		if len(rest) == 0 {
			break
		}
		if asked == "" || answered[asked] || runErr == nil {
			return nil, fmt.Errorf("resolve probe stopped before %s without naming why: %w", rest[0], runErr)
		}
		// The probe of asked never answered: the interpreter died or hung in it.
		res.Modules[asked] = false
		res.Errors[asked] = fmt.Sprintf("probing it stopped the interpreter: %v", runErr)
		todo = nil
		for _, c := range rest {
			if c != asked {
				todo = append(todo, c)
			}
		}
	}
	return res, nil
}

// runPython runs python3 -c script with args in a sandbox of the image's shape and returns its
// stdout and how the process ended (runErr: a non-zero exit or a timeout, with the stderr's
// end); err is what must stop the analysis (a sandbox that could not be made or deleted).
func (s *starter) runPython(ctx context.Context, step, script string, args []string) (out string, runErr, err error) {
	s.started.Add(1)
	sb, err := s.launcher.NewSandbox("analyze", step, sandbox.ModeSandbox, nil, append([]string{"python3", "-c", script}, args...))
	if err != nil {
		return "", nil, err
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, s.launcher.Timeout, fmt.Errorf("%s sandbox exceeded its timeout of %s (analysis.timeout)", step, s.launcher.Timeout))
	defer cancel()
	status, runErr := sb.Run(runCtx)
	if err := sb.Delete(ctx); err != nil {
		return "", nil, errors.Join(runErr, err)
	}
	data, err := os.ReadFile(sb.Stdout)
	if err != nil {
		return "", nil, err
	}
	if runErr == nil && status != 0 {
		runErr = fmt.Errorf("python3 exited with status %d", status)
	}
	if runErr != nil {
		if tail := sb.Tail(5); tail != "" {
			runErr = fmt.Errorf("%w\nstderr:\n%s", runErr, tail)
		}
	}
	return string(data), runErr, nil
}
