package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"readie.dev/pipeline/internal/analysis"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// Action is what a run does with one package set.
type Action string

const (
	// Capture captures the set: no checkpoint with its key is in the output or the store.
	Capture Action = "capture"
	// Reuse takes the checkpoint with the set's key from the output or the store, and
	// smoke-tests it again.
	Reuse Action = "reuse"
	// Keep carries a set that the run does not work on (--only, --set) over from the output,
	// its key unchanged.
	Keep Action = "keep"
)

// Where a reused or kept checkpoint comes from.
const (
	FromOutput = "output"
	FromStore  = "store"
)

// SetPlan is what a run will do with one package set, and why.
type SetPlan struct {
	Set      config.Set        `json:"-"`
	ID       string            `json:"id"`
	Imports  []string          `json:"imports"`
	Key      string            `json:"key"`
	KeyParts map[string]string `json:"-"`
	Action   Action            `json:"action"`
	From     string            `json:"from,omitempty"`
	// Reason is why, in a few words; Detail is the whole story (errors, hashes) for the log.
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Timings says when the timings a reuse or keep takes over were measured under other
	// settings than this run's (another restore_runs or other restore flags).
	Timings string `json:"timings,omitempty"`

	existing *manifest.Checkpoint // the output's checkpoint (Reuse or Keep from the output)
	stored   *manifest.Meta       // the store's entry (Reuse from the store)
	corrupt  error                // a stored entry with this key that must be removed first
	// unreadable is an error reading the store's entry for this key, which says nothing about
	// the entry: it is left as it is, and the set fails with this error.
	unreadable error
}

// Dropped is a set of the existing output that the new output will not hold.
type Dropped struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// Plan is what a capture will do, decided before any work: `pipeline plan` prints it and
// `pipeline capture` carries it out, so the two always agree.
type Plan struct {
	Out     string          `json:"output"`
	Rootfs  manifest.Rootfs `json:"rootfs"`
	Sets    []SetPlan       `json:"sets"`
	Dropped []Dropped       `json:"dropped"`

	old *manifest.Manifest // the existing output's manifest, if it has a usable one
	// cpu is what the checkpoints will need of a host's CPU (the manifest's cpu).
	cpu manifest.CPU
	// faulting: this host has CPUID faulting (the judgement of a baseline's check says why not).
	faulting bool
	// unenforceable is the first capture's refusal that holds for every set on this host (the
	// CPUID instruction shows features beyond the baseline): the sets not yet captured are not.
	unenforceable atomic.Pointer[string] // the set whose capture showed it
}

// CaptureOptions are the choices of a capture beyond the config.
type CaptureOptions struct {
	Selection *config.Selection
	// Recapture ignores the output's and the store's checkpoints.
	Recapture bool
	// Remeasure times the restores of reused checkpoints again.
	Remeasure bool
	// Analysis gives catalogue.json its module figures when the output holds no analysis.json
	// of this image (the caller found one in the analysis cache); nil: none.
	Analysis *analysis.File
	// Predicted is the planned image size of each set by id (capture --plan), compared with
	// the real one in catalogue.json.
	Predicted map[string]float64
}

// keyBase holds the key inputs every set of a run shares, and what the checkpoints will need
// of a host's CPU.
func (e *Env) keyBase(ctx context.Context) (store.KeyInputs, manifest.CPU, error) {
	spec, err := e.restoreSpec()
	if err != nil {
		return store.KeyInputs{}, manifest.CPU{}, err
	}
	fingerprint, err := sandbox.Fingerprint(spec, e.Runtime.Flags)
	if err != nil {
		return store.KeyInputs{}, manifest.CPU{}, err
	}
	need, err := e.cpuNeeds(ctx)
	if err != nil {
		return store.KeyInputs{}, manifest.CPU{}, err
	}
	return store.KeyInputs{
		Schema:            store.KeySchema,
		RunscSHA256:       e.RunscSHA256,
		RunscFlags:        e.Runtime.Flags.Args(),
		CheckpointOptions: e.Config.Runsc.CheckpointOptions,
		SpecFingerprint:   fingerprint,
		RootfsDigest:      e.Rootfs.Digest,
		ExecutorProtocol:  executorproto.Version,
		PassEnv:           store.PassEnvValues(e.Config.PassEnv, os.LookupEnv),
		CPU:               store.CPU{Features: strings.Join(need.Features, ","), CacheLine: need.CacheLine, Controls: need.Controls},
	}, need, nil
}

// cpuNeeds is what the checkpoints of this run will need of a host's CPU: this host's
// features, or the config's baseline, which must be part of them, and this host's cache line,
// which every host type of the baseline's file that names one must share.
func (e *Env) cpuNeeds(ctx context.Context) (manifest.CPU, error) {
	host, err := cpu.ReadHost(ctx, e.Runtime.Path, e.Config.Timeouts.RunscCommand)
	if err != nil {
		return manifest.CPU{}, err
	}
	need := manifest.CPU{Features: host.Features, CacheLine: host.CacheLine}
	b := e.Config.CPUBaseline
	if b == nil {
		return need, nil
	}
	if missing := cpu.Missing(b.Features, host.Features); len(missing) > 0 {
		return manifest.CPU{}, fmt.Errorf("%w: cpu_baseline names features this host lacks: %s (a sandbox can only be given features of the host it runs on: build on a host that has them, or leave them out of the baseline)", ErrSetup, strings.Join(missing, ", "))
	}
	for i, h := range b.Hosts {
		if h.CacheLine != 0 && h.CacheLine != host.CacheLine {
			return manifest.CPU{}, fmt.Errorf("%w: cpu_baseline.file %s: host type %d has a cache line of %d bytes, this host %d: restore requires them equal, so no checkpoint from here restores there (build one output per cache line)", ErrSetup, b.File, i+1, h.CacheLine, host.CacheLine)
		}
	}
	need.Features, need.Baseline, need.Controls = b.Features, b.Features, e.controls
	return need, nil
}

// Store is the checkpoint store the config names, written under this run's lease.
func (e *Env) Store() *store.Store {
	return &store.Store{Dir: e.Config.CheckpointCache, Lease: e.lease}
}

// loadOld reads the existing output's manifest; an output without one, or with one this
// pipeline cannot use, gives nil (its sets are then all captured or dropped).
func loadOld(out string) *manifest.Manifest {
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil || m.CheckProtocol(executorproto.Version) != nil {
		return nil
	}
	return m
}

// Plan decides what a capture into out does with each set; it changes nothing on disk. The
// rootfs must be open (OpenRootfs) in e.
func (e *Env) Plan(ctx context.Context, out string, o CaptureOptions) (*Plan, error) {
	base, need, err := e.keyBase(ctx)
	if err != nil {
		return nil, err
	}
	p := &Plan{Out: out, Rootfs: e.Rootfs, Sets: []SetPlan{}, Dropped: []Dropped{}, old: loadOld(out), cpu: need}
	if e.Config.CPUBaseline != nil {
		if p.faulting, err = cpu.CPUIDFaulting(cpu.CPUInfo); err != nil {
			return nil, err
		}
	}
	old := map[string]*manifest.Checkpoint{}
	if p.old != nil {
		for i := range p.old.Checkpoints {
			old[p.old.Checkpoints[i].ID] = &p.old.Checkpoints[i]
		}
	}
	keyOf := func(s config.Set) (string, map[string]string) {
		in := base
		in.Imports = slices.Clone(s.Imports)
		return in.Key(), in.Parts()
	}
	st := e.Store()
	inPlan := map[string]bool{}
	for _, set := range o.Selection.Sets {
		key, parts := keyOf(set)
		sp := SetPlan{Set: set, ID: set.ID, Imports: set.Imports, Key: key, KeyParts: parts}
		prev := old[set.ID]
		if !o.Selection.Picks(set.ID) {
			if prev == nil {
				continue // never captured, and not asked for now
			}
			if prev.Key != key {
				p.Dropped = append(p.Dropped, Dropped{ID: set.ID, Reason: changedReason(prev, parts)})
				inPlan[set.ID] = true
				continue
			}
			sp.Action, sp.From, sp.existing, sp.Reason = Keep, FromOutput, prev, "not selected; its key still matches"
			sp.Timings = e.timingsNote(sp)
			p.Sets = append(p.Sets, sp)
			inPlan[set.ID] = true
			continue
		}
		e.decide(&sp, out, prev, st, o.Recapture)
		if !o.Remeasure {
			sp.Timings = e.timingsNote(sp)
		}
		p.Sets = append(p.Sets, sp)
		inPlan[set.ID] = true
	}
	if p.old != nil {
		for i := range p.old.Checkpoints {
			prev := &p.old.Checkpoints[i]
			if inPlan[prev.ID] {
				continue
			}
			if o.Selection.Picked == nil {
				p.Dropped = append(p.Dropped, Dropped{ID: prev.ID, Reason: "not in the config"})
				continue
			}
			// A set an earlier run added (--set): kept while its key matches.
			set := config.Set{ID: prev.ID, Imports: slices.Clone(prev.Imports)}
			key, parts := keyOf(set)
			if prev.Key != key {
				p.Dropped = append(p.Dropped, Dropped{ID: prev.ID, Reason: changedReason(prev, parts)})
				continue
			}
			sp := SetPlan{Set: set, ID: set.ID, Imports: set.Imports, Key: key, KeyParts: parts,
				Action: Keep, From: FromOutput, existing: prev, Reason: "not selected; its key still matches"}
			sp.Timings = e.timingsNote(sp)
			p.Sets = append(p.Sets, sp)
		}
	}
	return p, nil
}

// Log writes what the plan's short reasons leave out: the details of entries that did not
// verify, and timings measured under other settings.
func (p *Plan) Log(log logrus.FieldLogger) {
	for _, sp := range p.Sets {
		if sp.Detail != "" {
			log.WithFields(logrus.Fields{"set": sp.ID, "reason": sp.Reason}).Warn(sp.Detail)
		}
		if sp.Timings != "" {
			log.WithField("set", sp.ID).Warn(sp.Timings)
		}
	}
}

// decide picks reuse from the output, reuse from the store, or capture, for a selected set.
func (e *Env) decide(sp *SetPlan, out string, prev *manifest.Checkpoint, st *store.Store, recapture bool) {
	sp.Action = Capture
	if recapture {
		sp.Reason = "--recapture"
		return
	}
	if prev != nil && prev.Key == sp.Key {
		dir := filepath.Join(out, prev.Dir)
		meta, err := manifest.LoadMeta(filepath.Join(dir, manifest.MetaFileName))
		if err == nil {
			err = store.VerifyFiles(dir, meta)
		}
		if err == nil {
			sp.Action, sp.From, sp.existing, sp.Reason = Reuse, FromOutput, prev, "same key in the output"
			return
		}
		sp.Reason, sp.Detail = "the output's copy does not verify", err.Error()
	}
	stored, err := st.Lookup(sp.Key)
	switch {
	case err != nil && !errors.Is(err, store.ErrCorrupt):
		sp.unreadable = err
		sp.Reason = joinReason(sp.Reason, fmt.Sprintf("the store's entry cannot be read; it is left as it is and the set fails (%v)", err))
	case err != nil:
		sp.corrupt = err
		sp.Reason = joinReason(sp.Reason, "the store's entry is corrupt: it is removed")
		sp.Detail = joinReason(sp.Detail, err.Error())
	case stored != nil:
		sp.Action, sp.From, sp.stored, sp.Reason = Reuse, FromStore, stored, "same key in the store"
	case prev != nil && prev.Key != sp.Key:
		sp.Reason = joinReason(sp.Reason, changedReason(prev, sp.KeyParts)+"; not in the store")
	default:
		sp.Reason = joinReason(sp.Reason, "not in the store")
	}
}

// timingsNote says when the timings sp takes over (from the output or the store) were measured
// under other settings than this run's; "" when they were not, or when sp measures anew.
func (e *Env) timingsNote(sp SetPlan) string {
	var stats *manifest.Stats
	var with *manifest.Measured
	switch {
	case sp.Action == Capture:
		return ""
	case sp.existing != nil:
		stats, with = &sp.existing.RestoreMS, sp.existing.MeasuredWith
	case sp.stored != nil:
		stats, with = sp.stored.RestoreMS, sp.stored.MeasuredWith
	}
	if stats == nil || len(stats.Runs) == 0 {
		return "" // none to keep: they are measured now
	}
	runs, flags := len(stats.Runs), "unknown restore flags"
	if with != nil {
		flags = fmt.Sprintf("restore flags %v", with.RestoreFlags)
	}
	sameFlags := with != nil && slices.Equal(with.RestoreFlags, e.RestoreFlags) || with == nil && runs == e.Config.RestoreRuns
	if runs == e.Config.RestoreRuns && sameFlags {
		return ""
	}
	return fmt.Sprintf("kept timings were measured with %d runs and %s, this run uses %d and %v: --remeasure times them again",
		runs, flags, e.Config.RestoreRuns, e.RestoreFlags)
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// changedReason names the parts of the key that changed since prev was captured.
func changedReason(prev *manifest.Checkpoint, parts map[string]string) string {
	if len(prev.KeyParts) == 0 {
		return "its key changed (the output predates key parts)"
	}
	return "changed since the output: " + strings.Join(store.Diff(prev.KeyParts, parts), ", ")
}

// errFailedSets reports a run in which some sets failed; the summary says which and why.
var errFailedSets = errors.New("package sets failed")
