package outdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// What an output directory holds besides its checkpoint directories. A run replaces an output
// as a whole; the entries of carriedOver belong to other commands (the benchmark's history,
// analyze's and plan-sets' results) and move over to the new output.
var (
	outputFiles = []string{manifest.FileName, manifest.RestoreSpecFileName, "catalogue.json"}
	carriedOver = []string{"bench", "analysis.json", "plan.json"}
)

// Outputs are immutable: a file is replaced (atomically, by rename), never written in place,
// and image files are hard links shared with the store and with other outputs, so a write
// into one would change them all. Their modes say so.
const (
	// FilePerm is the mode of manifest.json, meta.json, restore-spec.json and the like.
	FilePerm = 0o444
)

// WriteJSON writes v as JSON into the output file path atomically, with an output file's mode
// (FilePerm).
func WriteJSON(path string, v any) error {
	return atomicfile.WriteJSONPerm(path, v, FilePerm)
}

// Check refuses an output path that a run must not replace: a file, or a directory that
// holds anything the pipeline did not write there (an output is replaced as a whole, so
// whatever else is in it would be lost). An absent or empty directory is fine, and so is a
// temporary file of one of the pipeline's files that a killed writer left (the next writer
// sweeps it: sweepTemporaries).
func Check(out string) error {
	fi, err := os.Stat(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: output %s: %w", ErrSetup, out, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: output %s exists and is not a directory", ErrSetup, out)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return fmt.Errorf("%w: output %s: %w", ErrSetup, out, err)
	}
	ours := slices.Concat(outputFiles, carriedOver)
	if m, err := manifest.Load(filepath.Join(out, manifest.FileName)); err == nil {
		for _, c := range m.Checkpoints {
			ours = append(ours, filepath.Clean(c.Dir))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: output %s holds a manifest.json the pipeline cannot read (%w): it is not replaced; move it away or choose another output", ErrSetup, out, err)
	}
	var strangers []string
	for _, e := range entries {
		base, temporary := atomicfile.TempOf(e.Name())
		if !slices.Contains(ours, e.Name()) && !(temporary && e.Type().IsRegular() && slices.Contains(ours, base)) {
			strangers = append(strangers, e.Name())
		}
	}
	if len(strangers) > 0 {
		if len(strangers) > 5 {
			strangers = append(strangers[:5], fmt.Sprintf("and %d more", len(strangers)-5))
		}
		return fmt.Errorf("%w: output %s is not an output of the pipeline: it holds %s, which a run would delete when it replaces the directory; move them away or choose another output", ErrSetup, out, strings.Join(strangers, ", "))
	}
	return nil
}

// carryOver moves the entries of carriedOver from the output from into the output to, unless
// to has one of its own.
func carryOver(from, to string) error {
	for _, name := range carriedOver {
		src, dst := filepath.Join(from, name), filepath.Join(to, name)
		if _, err := os.Lstat(src); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// Verify verifies out (manifest.Verify) and, when it does not verify, says which store
// entries of st share a file that does not verify: outputs take their image files from the
// store by hard link, so such an entry, and every output linked to it, holds the same bytes.
func Verify(out string, st *store.Store) (*manifest.Manifest, error) {
	m, err := manifest.Verify(out, executorproto.Version)
	if err == nil || m == nil {
		return m, err
	}
	var shared []string
	for _, c := range m.Checkpoints {
		entry, perr := st.Path(c.Key)
		if perr != nil {
			continue
		}
		var linked []string
		for _, name := range manifest.ImageFiles() {
			a, aerr := os.Stat(filepath.Join(out, c.Dir, name))
			b, berr := os.Stat(filepath.Join(entry, name))
			if aerr == nil && berr == nil && os.SameFile(a, b) {
				linked = append(linked, filepath.Join(entry, name))
			}
		}
		if len(linked) == 0 {
			continue
		}
		meta, merr := manifest.LoadMeta(filepath.Join(entry, manifest.MetaFileName))
		problems := []error{merr}
		if merr == nil {
			problems = manifest.CheckFiles(entry, meta)
		}
		for _, p := range problems {
			// Only a problem of a file the output shares says something about the output.
			what := "its files"
			if i := slices.IndexFunc(linked, func(path string) bool { return strings.Contains(p.Error(), path) }); i >= 0 {
				what = filepath.Base(linked[i])
			} else if merr == nil {
				continue
			}
			shared = append(shared, fmt.Sprintf("checkpoint %s shares %s with the store entry %s, which does not verify either (%v): every output linked to it holds the same bytes, and the next capture of its key captures it again", c.ID, what, entry, p))
		}
	}
	if len(shared) > 0 {
		err = fmt.Errorf("%w\n%s", err, strings.Join(shared, "\n"))
	}
	return m, err
}
