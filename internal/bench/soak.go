package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pycall"
)

// SoakOptions say how long `pipeline bench --soak` runs and how.
type SoakOptions struct {
	Only []string
	// Count restores in all, or (when Count is 0) as many as Duration allows.
	Count    int
	Duration time.Duration
	// Concurrency is the number of restores under way at once.
	Concurrency int
	// KillEvery, when set, SIGKILLs the sandbox process of every KillEvery-th restore once its
	// executor accepted the connection and before the call (a fault to recover from).
	KillEvery int
	// SampleEvery is how often what is left is sampled while the soak runs (besides its start
	// and its end); zero means DefaultSoakSample.
	SampleEvery time.Duration
}

// DefaultSoakSample is how often a soak samples what is left while it runs.
const DefaultSoakSample = time.Minute

// ErrSoak means a soak had a failure that no induced fault explains, or left something behind.
var ErrSoak = errors.New("soak failed")

// SoakReport is soak.json: every restore's outcome summed up, per minute and whole, and what
// was left at the start, at intervals and at the end.
type SoakReport struct {
	CreatedAt    time.Time      `json:"created_at"`
	Machine      Machine        `json:"machine"`
	Runsc        manifest.Runsc `json:"runsc"`
	RunscFlags   []string       `json:"runsc_flags"`
	RestoreFlags []string       `json:"restore_flags"`
	Checkpoints  []string       `json:"checkpoints"`
	Concurrency  int            `json:"concurrency"`
	KillEvery    int            `json:"kill_every,omitempty"`
	// Requested is the --soak value: a count of restores or a duration.
	Requested string  `json:"requested"`
	Seconds   float64 `json:"seconds"`
	// Restores counts the restores attempted, Failures those that failed, Killed those whose
	// sandbox the soak killed on purpose (each of them a failure, reported as such).
	Restores int           `json:"restores"`
	Failures int           `json:"failures"`
	Killed   int           `json:"killed"`
	Errors   []SoakFailure `json:"errors"`
	// Latency is from the start of `runsc restore` to the checked answer, successes only.
	Latency manifest.Stats `json:"latency_ms"`
	Minutes []SoakMinute   `json:"minutes"`
	Samples []Leftovers    `json:"samples"`
	// Left names what the end has more of than the start: empty when nothing was left.
	Left []string `json:"left"`
	Dir  string   `json:"-"`
}

// SoakFailure is one failed restore.
type SoakFailure struct {
	N          int    `json:"n"`
	Checkpoint string `json:"checkpoint"`
	Killed     bool   `json:"killed"`
	Error      string `json:"error"`
}

// SoakMinute is the restores that ended in one minute of the soak (drift shows here).
type SoakMinute struct {
	Minute   int     `json:"minute"`
	Restores int     `json:"restores"`
	Failures int     `json:"failures"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
}

// Unexpected counts the failures that no induced fault explains.
func (r *SoakReport) Unexpected() int {
	n := 0
	for _, f := range r.Errors {
		if !f.Killed {
			n++
		}
	}
	return n
}

// Soak restores the checkpoints of out in turn, Concurrency at once, through the worker's path
// (launch.Restorer.Restore: the output opened as a worker opens it, its restore spec, sandboxes
// created on demand with the run's lease-bound IDs), checks
// every answer (the checkpoint's modules loaded, the restore-time environment seen), and
// samples what is left. It writes soak.json into a new directory under OUT/bench. The error
// matches ErrSoak when a failure was not induced or something was left.
func Soak(ctx context.Context, env *run.Env, out string, o SoakOptions) (*SoakReport, error) {
	var report *SoakReport
	_, err := env.WithVerifiedOutput(ctx, out, o.Only, func(x *run.VerifiedOutput) error {
		var err error
		report, err = soakOn(ctx, x, o)
		return err
	})
	return report, err
}

// soaker is one soak's shared state: the restorer every restore goes through, as a worker's
// (launch.Restorer), with the run's lease-bound IDs, and the token its sandboxes see.
type soaker struct {
	restorer *launch.Restorer
	token    string
	timeout  time.Duration
}

func soakOn(ctx context.Context, x *run.VerifiedOutput, o SoakOptions) (*SoakReport, error) {
	env, m := x.Sandboxes, x.Manifest
	// The token is in the environment every sandbox is created with, which a restore onto it
	// keeps: each answer reads it back.
	s := &soaker{token: randomToken(), timeout: env.Config.Timeouts.Restore}
	var err error
	s.restorer, err = x.Output.Restorer(launch.Options{Runtime: env.Runtime, WorkDir: x.Work, Env: []string{pycall.SmokeTokenVar + "=" + s.token}, Limits: env.Config.SandboxLimits()})
	if err != nil {
		return nil, err
	}
	driver, leaseID, log := env.Runtime.Driver(), env.Runtime.Lease.ID(), env.Log
	report := &SoakReport{
		CreatedAt: time.Now().UTC(), Machine: ThisMachine(), Runsc: m.Runsc, RunscFlags: env.Runtime.Flags.Args(),
		RestoreFlags: slices.Clone(m.RestoreFlags), Concurrency: o.Concurrency, KillEvery: o.KillEvery, Errors: []SoakFailure{},
	}
	for _, c := range x.Picked {
		report.Checkpoints = append(report.Checkpoints, c.ID)
	}
	if o.Count > 0 {
		report.Requested = fmt.Sprint(o.Count)
	} else {
		report.Requested = o.Duration.String()
	}
	probe := leftoverProbe{root: driver.Root, tmp: os.TempDir(), work: x.Work, lease: leaseID, driver: driver}
	first := probe.sample(ctx, 0, true)
	report.Samples = append(report.Samples, first)

	start := time.Now()
	var deadline time.Time
	if o.Count == 0 {
		deadline = start.Add(o.Duration)
	}
	type outcome struct {
		n       int
		set     string
		ended   time.Duration
		latency time.Duration
		killed  bool
		err     error
	}
	var (
		mu       sync.Mutex
		next     int
		outcomes []outcome
	)
	claim := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil || (o.Count > 0 && next >= o.Count) || (o.Count == 0 && !time.Now().Before(deadline)) {
			return 0, false
		}
		next++
		return next, true
	}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	every := o.SampleEvery
	if every <= 0 {
		every = DefaultSoakSample
	}
	go func() {
		defer close(sampled)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				mu.Lock()
				done := len(outcomes)
				mu.Unlock()
				sample := probe.sample(ctx, done, false)
				mu.Lock()
				report.Samples = append(report.Samples, sample)
				mu.Unlock()
				log.WithFields(logrus.Fields{"restores": done, "sandboxes": sample.Sandboxes, "fds": sample.FDs, "mem_available_mib": sample.MemAvailableKiB >> 10}).Info("soak: sample")
			}
		}
	}()

	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Go(func() {
			for {
				n, ok := claim()
				if !ok {
					return
				}
				c := x.Picked[(n-1)%len(x.Picked)]
				kill := o.KillEvery > 0 && n%o.KillEvery == 0
				latency, err := s.one(ctx, c, kill)
				mu.Lock()
				outcomes = append(outcomes, outcome{n: n, set: c.ID, ended: time.Since(start), latency: latency, killed: kill, err: err})
				done := len(outcomes)
				mu.Unlock()
				if err != nil {
					log.WithFields(logrus.Fields{"n": n, "set": c.ID, "killed": kill}).Warnf("soak: restore failed: %v", err)
				}
				if done%100 == 0 {
					log.WithField("restores", done).Info("soak: progress")
				}
			}
		})
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	report.Seconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("soak stopped after %d restores: %w", len(outcomes), context.Cause(ctx))
	}

	slices.SortFunc(outcomes, func(a, b outcome) int { return a.n - b.n })
	var latencies []float64
	perMinute := map[int]*struct {
		restores, failures int
		ms                 []float64
	}{}
	for _, oc := range outcomes {
		report.Restores++
		minute := int(oc.ended / time.Minute)
		pm := perMinute[minute]
		if pm == nil {
			pm = &struct {
				restores, failures int
				ms                 []float64
			}{}
			perMinute[minute] = pm
		}
		pm.restores++
		if oc.killed {
			report.Killed++
		}
		if oc.err != nil {
			report.Failures++
			pm.failures++
			report.Errors = append(report.Errors, SoakFailure{N: oc.n, Checkpoint: oc.set, Killed: oc.killed, Error: oc.err.Error()})
			continue
		}
		ms := float64(oc.latency.Microseconds()) / 1000
		latencies = append(latencies, ms)
		pm.ms = append(pm.ms, ms)
	}
	report.Latency = measure.Summarize(latencies)
	for _, minute := range slices.Sorted(maps.Keys(perMinute)) {
		pm := perMinute[minute]
		sorted := slices.Sorted(slices.Values(pm.ms))
		sm := SoakMinute{Minute: minute, Restores: pm.restores, Failures: pm.failures}
		if len(sorted) > 0 {
			sm.P50, sm.P99 = measure.Percentile(sorted, 50), measure.Percentile(sorted, 99)
		}
		report.Minutes = append(report.Minutes, sm)
	}
	last := probe.sample(ctx, len(outcomes), true)
	report.Samples = append(report.Samples, last)
	report.Left = first.left(last)

	dir, err := newRunDir(x.Out, report.CreatedAt)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, "soak.json"), report); err != nil {
		return nil, err
	}
	report.Dir = dir
	if n := report.Unexpected(); n > 0 || len(report.Left) > 0 {
		return report, fmt.Errorf("%w: %d restores, %d failures (%d not induced); left at the end: %v", ErrSoak, report.Restores, report.Failures, n, report.Left)
	}
	return report, nil
}

// one restores c as a worker does, through the kit's one restore path (launch.Restorer: a
// sandbox created, never killed half-way, the checkpoint restored, the executor dialled), calls
// it and checks the answer; the sandbox and its directories are removed on every path. It
// returns the time from the start of the restore to the checked answer. With kill, the
// sandbox process is killed with SIGKILL once the executor accepted, before the call.
func (s *soaker) one(ctx context.Context, c *manifest.Checkpoint, kill bool) (latency time.Duration, err error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, fmt.Errorf("a soak restore of %s exceeded timeouts.restore (%s)", c.ID, s.timeout))
	defer cancel()
	request, err := pycall.SmokeRequest(c.Imports)
	if err != nil {
		return 0, err
	}
	restored, err := s.restorer.Restore(ctx, c.ID, launch.RestoreOptions{})
	if err != nil {
		return 0, err
	}
	defer func() {
		// Deleted on every path, after a cancel too; a failure comes with the executor's words.
		if closeErr := restored.Close(ctx); closeErr != nil || err != nil {
			err = errors.Join(err, closeErr)
			if tail := restored.Sandbox.Tail(10); tail != "" {
				err = fmt.Errorf("%w\nexecutor stderr:\n%s", err, tail)
			}
		}
	}()
	if kill {
		if err := killSandbox(ctx, restored.Sandbox); err != nil {
			return 0, err
		}
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		return 0, err
	}
	if err := pycall.CheckSmokeResponse(response, s.token); err != nil {
		return 0, err
	}
	latency = time.Since(restored.Marks.Began)
	if kill {
		return latency, errors.New("the executor answered after its sandbox was killed with SIGKILL")
	}
	return latency, nil
}

// killSandbox sends SIGKILL to the sandbox process of sb (runsc state's pid: this pipeline
// made it, in this pid namespace).
func killSandbox(ctx context.Context, sb *launch.Sandbox) error {
	st, err := sb.State(ctx)
	if err != nil {
		return err
	}
	if st.Pid <= 0 {
		return fmt.Errorf("runsc state of %s gives no pid to kill", sb.ID)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill the sandbox process %d of %s: %w", st.Pid, sb.ID, err)
	}
	return nil
}

func randomToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
