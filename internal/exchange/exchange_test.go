package exchange

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/manifest"
)

func TestMergeCatalogueInputs(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	in := outcatalogue.Inputs{
		Modules: map[string]catalogue.Module{"numpy": {Available: true, ImportMs: 200, MiB: 9.5, OwnMs: 200, OwnMiB: 9.5, Closure: []string{"numpy"}}},
		Model:   &catalogue.CostModel{ColdStartMs: 400},
	}
	m := &manifest.Manifest{Checkpoints: []manifest.Checkpoint{{ID: "empty", Imports: []string{}, Bytes: 8 << 20, RestoreMS: manifest.Stats{Median: 150}}}}
	if _, err := outcatalogue.Write(a, m, in); err != nil {
		t.Fatal(err)
	}
	got, err := mergeCatalogueInputs([]mergeSource{{dir: a}, {dir: b}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Modules) != 1 || got.Model == nil || got.Model.ColdStartMs != 400 {
		t.Errorf("merged inputs %+v", got)
	}
	atomicfile.Write(filepath.Join(b, catalogue.FileName), []byte(`[]`), 0o644)
	if _, err := mergeCatalogueInputs([]mergeSource{{dir: a}, {dir: b}}); !errors.Is(err, ErrMerge) {
		t.Errorf("a source with a bad catalogue: %v", err)
	}
}

// TestPullAsideIsSweptByLease: a pull that only reads the manifest (check-host --image) works
// in a scratch directory named after a lease of its own, which a sweep leaves while the pull
// lives (and removes once it is over, TestRemoveDeadWorkDirs), and which is gone when it
// returns.
func TestPullAsideIsSweptByLease(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	probed := false
	_, err := PullAside(context.Background(), probeImage{probe: func() {
		probed = true
		dirs, _ := filepath.Glob(filepath.Join(tmp, scratch.Prefix+"*"))
		if len(dirs) != 1 {
			t.Errorf("while it pulls, TMPDIR holds %v; want one scratch directory named after a lease", dirs)
		}
		if removed, err := (*lease.Lease)(nil).RemoveDeadDirs(tmp, scratch.Prefix); len(removed) != 0 || err != nil {
			t.Errorf("a sweep removed %v (%v) while the pull lives", removed, err)
		}
	}}, unpack.DefaultLimits(), testenv.DiscardLog(), nil, "pull")
	if err == nil || !probed {
		t.Fatalf("PullAside = %v (probed %v); want the test's stop", err, probed)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "*"))
	locks, _ := filepath.Glob(filepath.Join(tmp, lease.RunsDir, "*"))
	if len(left) != 1 || left[0] != filepath.Join(tmp, lease.RunsDir) || len(locks) != 0 {
		t.Errorf("left %v and lock files %v", left, locks)
	}
}

// TestMergeSweepsDeadMergesPulls: a merge first removes, beside its output, the pulled sources
// of merges that died (named after their lease), and leaves a live merge's.
func TestMergeSweepsDeadMergesPulls(t *testing.T) {
	cfg, err := config.Parse([]byte("{}\n"), "test.yaml", t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	live, dead := testenv.NewLease(t), testenv.NewLease(t)
	pull := func(l *lease.Lease) string {
		t.Helper()
		if err := l.Hold(filepath.Dir(out)); err != nil {
			t.Fatal(err)
		}
		d, err := os.MkdirTemp(filepath.Dir(out), outdir.MergePullPrefix+l.ID()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	deadPull, livePull := pull(dead), pull(live)
	dead.Release()
	_, err = MergeSources(context.Background(), cfg, out, []string{filepath.Join(t.TempDir(), "missing")}, testenv.DiscardLog())
	if !errors.Is(err, outdir.ErrSetup) {
		t.Fatalf("a merge of a missing source: %v, want a setup error", err)
	}
	if _, err := os.Stat(deadPull); !os.IsNotExist(err) {
		t.Errorf("a dead merge's %s is still there (%v)", deadPull, err)
	}
	if _, err := os.Stat(livePull); err != nil {
		t.Errorf("a live merge's %s was removed: %v", livePull, err)
	}
}

// probeImage is an image whose Manifest runs probe, then fails: a pull stops there.
type probeImage struct {
	v1.Image
	probe func()
}

func (i probeImage) Manifest() (*v1.Manifest, error) {
	i.probe()
	return nil, errors.New("stopped by the test")
}
