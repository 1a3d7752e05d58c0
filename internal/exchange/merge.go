// Package exchange writes outputs from other outputs and moves them between places: a merge
// of several outputs into one (Merge, MergeSources), a pull of an output from an image (Pull,
// PullAside) and a push of one to a registry (Push), each through the output's life cycle
// (outdir).
package exchange

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/manifest"
)

// ErrMerge reports sources that cannot be merged into one output.
var ErrMerge = errors.New("merge refused")

// agreed is one field that every source of a merge must share; list is set for a field whose
// value is a set of names, so that a refusal can name the ones that differ.
type agreed struct {
	field, value string
	list         []string
}

// agreement returns the manifest fields every source of a merge must share: one worker restores
// every checkpoint of the result with the same runsc, flags, spec and rootfs, on hosts with
// the same CPU needs (shards captured with one cpu_baseline share them whatever CPU types
// their build hosts had).
func agreement(m *manifest.Manifest) []agreed {
	join := func(v []string) string { return "[" + strings.Join(v, " ") + "]" }
	pairs := func(kv map[string]string) string {
		var out []string
		for _, k := range slices.Sorted(maps.Keys(kv)) {
			out = append(out, k+"="+kv[k])
		}
		return join(out)
	}
	c := m.CPU
	if c == nil {
		c = &manifest.CPU{} // an output made before cpu was recorded
	}
	enforced := ""
	if c.Enforced != nil {
		enforced = fmt.Sprint(*c.Enforced)
	}
	return []agreed{
		{field: "executor_protocol", value: fmt.Sprint(m.ExecutorProtocol)},
		{field: "runsc.sha256", value: m.Runsc.SHA256},
		{field: "runsc.helpers", value: m.Runsc.HelpersText()},
		{field: "runsc.version", value: m.Runsc.Version},
		{field: "runsc_flags", value: join(m.RunscFlags)},
		{field: "restore_flags", value: join(m.RestoreFlags)},
		{field: "checkpoint_options", value: pairs(m.CheckpointOptions)},
		{field: "spec_fingerprint", value: m.SpecFingerprint},
		{field: "rootfs.digest", value: m.Rootfs.Digest},
		{field: "cpu.features", value: join(c.Features), list: c.Features},
		{field: "cpu.cache_line", value: fmt.Sprint(c.CacheLine)},
		{field: "cpu.baseline", value: join(c.Baseline), list: c.Baseline},
		{field: "cpu.enforced", value: enforced},
		{field: "cpu.controls", value: pairs(c.Controls)},
		{field: "cpus", value: fmt.Sprint(m.CPUs)},
	}
}

// disagreement says how two sources differ on one field.
func disagreement(want, have agreed, first, other string) error {
	if want.list == nil && have.list == nil {
		return fmt.Errorf("%w: the sources disagree on %s: %s has %s, %s has %s", ErrMerge, have.field, first, want.value, other, have.value)
	}
	only := func(a, b []string) string {
		if d := cpu.Missing(a, b); len(d) > 0 {
			return strings.Join(d, ", ")
		}
		return "nothing"
	}
	return fmt.Errorf("%w: the sources disagree on %s: only %s has %s; only %s has %s", ErrMerge, have.field,
		first, only(want.list, have.list), other, only(have.list, want.list))
}

// keyDifference names the key parts in which two checkpoints of one set differ.
func keyDifference(a, b map[string]string) string {
	if len(a) == 0 || len(b) == 0 {
		return "a source predates key parts, so which parts differ is not known"
	}
	return "they differ in " + strings.Join(store.Diff(a, b), ", ")
}

type mergeSource struct {
	dir string
	m   *manifest.Manifest
}

// picked is the checkpoint a merge takes for one set, and the source directory it is in.
type picked struct {
	c   manifest.Checkpoint
	src string
}

// Merge writes into out the union of the outputs srcs (shards of one catalogue): every source
// must verify and agree on what agreement lists; a set in several sources is kept once when
// its key is the same everywhere and refused when it differs. out is written as a capture's
// (lock, staging, swap), its files hard-linked from the sources when the file system allows.
// The same sources in any order give the same manifest.json, byte for byte.
func Merge(out string, srcs []string) (*manifest.Manifest, error) {
	sources, err := loadMergeSources(srcs)
	if err != nil {
		return nil, err
	}
	if err := checkMergeSources(sources); err != nil {
		return nil, err
	}
	byID, err := pickCheckpoints(sources)
	if err != nil {
		return nil, err
	}
	first := sources[0]
	m := *first.m
	m.Checkpoints = []manifest.Checkpoint{}
	m.RestoreFlagsConcurrency = 0 // legacy: nothing writes it any more
	for _, s := range sources[1:] {
		if s.m.CreatedAt.After(m.CreatedAt) {
			m.CreatedAt = s.m.CreatedAt
		}
	}
	err = outdir.Write(out, func(staging string) error {
		return writeMerged(staging, &m, byID, sources)
	})
	if err != nil {
		return nil, fmt.Errorf("merge into %s: %w", out, err)
	}
	return &m, nil
}

// loadMergeSources loads the manifest of each source directory (each once), in an order of
// their content: any order of the same sources gives the same output.
func loadMergeSources(srcs []string) ([]mergeSource, error) {
	var sources []mergeSource
	seen := map[string]bool{}
	for _, src := range srcs {
		abs, err := filepath.Abs(src)
		if err != nil {
			return nil, err
		}
		if seen[abs] {
			continue
		}
		seen[abs] = true
		m, err := manifest.Load(filepath.Join(abs, manifest.FileName))
		if err != nil {
			return nil, fmt.Errorf("%w: source %s: %w", ErrMerge, src, err)
		}
		sources = append(sources, mergeSource{dir: abs, m: m})
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("%w: %w: no sources", outdir.ErrSetup, ErrMerge)
	}
	// Taken by content (the time each was made), their paths only breaking ties between
	// copies of one output.
	slices.SortFunc(sources, func(a, b mergeSource) int {
		return cmp.Or(a.m.CreatedAt.Compare(b.m.CreatedAt), cmp.Compare(a.dir, b.dir))
	})
	return sources, nil
}

// checkMergeSources refuses sources that disagree on a field of agreement, or one that does
// not verify.
func checkMergeSources(sources []mergeSource) error {
	first := sources[0]
	want := agreement(first.m)
	for _, s := range sources[1:] {
		for i, have := range agreement(s.m) {
			if have.value != want[i].value {
				return disagreement(want[i], have, first.dir, s.dir)
			}
		}
	}
	for _, s := range sources {
		if _, err := manifest.Verify(s.dir, executorproto.Version); err != nil {
			return fmt.Errorf("%w: source %s: %w", ErrMerge, s.dir, err)
		}
	}
	return nil
}

// pickCheckpoints takes each set's checkpoint once: the earliest captured where sources share
// it; a set whose key differs between sources is refused, naming the parts that differ.
func pickCheckpoints(sources []mergeSource) (map[string]picked, error) {
	byID := map[string]picked{}
	for _, s := range sources {
		for _, c := range s.m.Checkpoints {
			if p, ok := byID[c.ID]; ok {
				if p.c.Key != c.Key {
					return nil, fmt.Errorf("%w: set %s has key %s in %s and %s in %s: %s", ErrMerge, c.ID, p.c.Key, p.src, c.Key, s.dir, keyDifference(p.c.KeyParts, c.KeyParts))
				}
				// The same checkpoint captured twice (every shard has empty): the earlier.
				if c.CapturedAt.Before(p.c.CapturedAt) {
					byID[c.ID] = picked{c, s.dir}
				}
				continue
			}
			byID[c.ID] = picked{c, s.dir}
		}
	}
	return byID, nil
}

// writeMerged writes the merged output into staging: the picked checkpoints ("empty" first,
// then by id) linked from their sources with their meta.json, the first source's restore
// spec, m with the checkpoints and its cost model, and the catalogue of every source's.
func writeMerged(staging string, m *manifest.Manifest, byID map[string]picked, sources []mergeSource) error {
	ids := slices.Sorted(maps.Keys(byID))
	if i := slices.Index(ids, config.EmptySetID); i > 0 {
		ids = append([]string{config.EmptySetID}, slices.Delete(ids, i, i+1)...)
	}
	for _, id := range ids {
		p := byID[id]
		src, dst := filepath.Join(p.src, p.c.Dir), filepath.Join(staging, id)
		if err := store.LinkFiles(src, dst); err != nil {
			return err
		}
		meta, err := limitread.OutputFile(filepath.Join(src, manifest.MetaFileName))
		if err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(dst, manifest.MetaFileName), meta, outdir.FilePerm); err != nil {
			return err
		}
		c := p.c
		c.Dir = id
		m.Checkpoints = append(m.Checkpoints, c)
	}
	first := sources[0]
	spec, err := limitread.OutputFile(filepath.Join(first.dir, first.m.Spec))
	if err != nil {
		return err
	}
	m.Spec = manifest.RestoreSpecFileName
	if err := atomicfile.Write(filepath.Join(staging, m.Spec), spec, outdir.FilePerm); err != nil {
		return err
	}
	m.AlphaMsPerMiB, m.InterceptMs = outcatalogue.CostModel(m.Checkpoints)
	if err := outdir.WriteJSON(filepath.Join(staging, manifest.FileName), m); err != nil {
		return err
	}
	in, err := mergeCatalogueInputs(sources)
	if err != nil {
		return err
	}
	_, err = outcatalogue.Write(staging, m, in)
	return err
}

// mergeCatalogueInputs returns the inputs of a merged output's catalogue: the modules of every
// source's catalogue (sources agree on the image, so a module measured by two has the figures
// of the first in merge order), the first source's cost model constants, every prediction.
func mergeCatalogueInputs(sources []mergeSource) (outcatalogue.Inputs, error) {
	in := outcatalogue.Inputs{Modules: map[string]catalogue.Module{}, Predicted: map[string]float64{}, From: "the sources' catalogues"}
	for _, s := range sources {
		path := filepath.Join(s.dir, catalogue.FileName)
		c, err := catalogue.Load(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return in, fmt.Errorf("%w: source %s: %w", ErrMerge, s.dir, err)
		}
		from := outcatalogue.FromCatalogue(c, path)
		for name, mod := range from.Modules {
			if _, ok := in.Modules[name]; !ok {
				in.Modules[name] = mod
			}
		}
		for id, p := range from.Predicted {
			if _, ok := in.Predicted[id]; !ok {
				in.Predicted[id] = p
			}
		}
		if in.Model == nil {
			in.Model = from.Model
		}
		if in.Packages == nil {
			in.Packages = from.Packages
		}
	}
	return in, nil
}
