package run

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
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
	Set      config.PackageSet `json:"-"`
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
// `pipeline capture` carries it out, so the two always agree. It is data only, not changed
// once made: the carry-out's state is the carrier's.
type Plan struct {
	Out     string          `json:"output"`
	Rootfs  manifest.Rootfs `json:"rootfs"`
	Sets    []SetPlan       `json:"sets"`
	Dropped []Dropped       `json:"dropped"`
}

// CaptureOptions are the choices of a capture beyond the config.
type CaptureOptions struct {
	Selection *config.Selection
	// Recapture ignores the output's and the store's checkpoints.
	Recapture bool
	// Remeasure times the restores of reused checkpoints again.
	Remeasure bool
	// Predicted is the planned image size of each set by id (capture --plan), compared with
	// the real one in catalogue.json.
	Predicted map[string]float64
}

// loadOld returns the existing output's manifest; an output without one, or with one this
// pipeline cannot use, gives nil (its sets are then all captured or dropped).
func loadOld(out string) *manifest.Manifest {
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil || m.CheckProtocol(executorproto.Version) != nil {
		return nil
	}
	return m
}

// Plan decides what a capture into out does with each set, on the config's rootfs (resolved
// here); it changes nothing on disk but the rootfs cache.
func (e *Env) Plan(ctx context.Context, out string, o CaptureOptions) (*Plan, error) {
	r, err := e.ResolveRootfs(ctx)
	if err != nil {
		return nil, err
	}
	b, err := e.basis(ctx, e.Sandboxes(r))
	if err != nil {
		return nil, err
	}
	return NewPlan(b, e.Store, out, o, e.Config.RestoreRuns), nil
}

// planner decides, set by set, what a capture into out does (NewPlan).
type planner struct {
	basis *Basis
	store *store.Store
	out   string
	o     CaptureOptions
	// restoreRuns is how many restores this run times (config restore_runs).
	restoreRuns int
	old         map[string]*manifest.Checkpoint // the existing output's checkpoints by id
}

// NewPlan decides what a capture into out does with each set of o.Selection, on basis b and
// with the checkpoints of st: it reads the output and the store (verifying what it would
// reuse) and changes nothing on disk. restoreRuns is config restore_runs, against which the
// timings a reuse takes over are judged.
func NewPlan(b *Basis, st *store.Store, out string, o CaptureOptions, restoreRuns int) *Plan {
	p := &Plan{Out: out, Rootfs: b.Rootfs, Sets: []SetPlan{}, Dropped: []Dropped{}}
	old := loadOld(out)
	pl := &planner{basis: b, store: st, out: out, o: o, restoreRuns: restoreRuns, old: map[string]*manifest.Checkpoint{}}
	if old != nil {
		for i := range old.Checkpoints {
			pl.old[old.Checkpoints[i].ID] = &old.Checkpoints[i]
		}
	}
	inPlan := map[string]bool{}
	for _, set := range o.Selection.Sets {
		if pl.old[set.ID] == nil && !o.Selection.Picks(set.ID) {
			continue // never captured, and not asked for now
		}
		inPlan[set.ID] = true
		pl.add(p, set)
	}
	if old != nil {
		for i := range old.Checkpoints {
			prev := &old.Checkpoints[i]
			switch {
			case inPlan[prev.ID]:
			case o.Selection.Picked == nil:
				p.Dropped = append(p.Dropped, Dropped{ID: prev.ID, Reason: "not in the config"})
			default:
				// A set an earlier run added (--set): kept while its key matches.
				pl.add(p, config.PackageSet{ID: prev.ID, Imports: slices.Clone(prev.Imports)})
			}
		}
	}
	return p
}

// add puts set into p: dropped or kept when it is not selected (by the output's checkpoint of
// its id, prev), else reused or captured (decide).
func (pl *planner) add(p *Plan, set config.PackageSet) {
	key, parts := pl.basis.KeyOf(set.Imports)
	sp := SetPlan{Set: set, ID: set.ID, Imports: set.Imports, Key: key, KeyParts: parts}
	prev := pl.old[set.ID]
	if !pl.o.Selection.Picks(set.ID) {
		if prev.Key != key {
			p.Dropped = append(p.Dropped, Dropped{ID: set.ID, Reason: changedReason(prev, parts)})
			return
		}
		sp.Action, sp.From, sp.existing, sp.Reason = Keep, FromOutput, prev, "not selected; its key still matches"
		sp.Timings = pl.timingsNote(sp)
		p.Sets = append(p.Sets, sp)
		return
	}
	pl.decide(&sp, prev)
	if !pl.o.Remeasure {
		sp.Timings = pl.timingsNote(sp)
	}
	p.Sets = append(p.Sets, sp)
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

// decide is the one place that decides whether a selected set is reused (from the output, then
// the store) or captured: reuse needs a checkpoint with the set's key whose files verify.
func (pl *planner) decide(sp *SetPlan, prev *manifest.Checkpoint) {
	sp.Action = Capture
	if pl.o.Recapture {
		sp.Reason = "--recapture"
		return
	}
	if prev != nil && prev.Key == sp.Key {
		dir := filepath.Join(pl.out, prev.Dir)
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
	stored, err := pl.store.Lookup(sp.Key)
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

// timingsNote returns a note when the timings sp takes over (from the output or the store)
// were measured under other settings than this run's; "" when they were not, or when sp
// measures anew.
func (pl *planner) timingsNote(sp SetPlan) string {
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
	restoreFlags := pl.basis.RestoreFlags
	sameFlags := with != nil && slices.Equal(with.RestoreFlags, restoreFlags) || with == nil && runs == pl.restoreRuns
	if runs == pl.restoreRuns && sameFlags {
		return ""
	}
	return fmt.Sprintf("kept timings were measured with %d runs and %s, this run uses %d and %v: --remeasure times them again",
		runs, flags, pl.restoreRuns, restoreFlags)
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// changedReason returns the parts of the key that changed since prev was captured.
func changedReason(prev *manifest.Checkpoint, parts map[string]string) string {
	if len(prev.KeyParts) == 0 {
		return "its key changed (the output predates key parts)"
	}
	return "changed since the output: " + strings.Join(store.Diff(prev.KeyParts, parts), ", ")
}

// errFailedSets reports a run in which some sets failed; the summary says which and why.
var errFailedSets = errors.New("package sets failed")
