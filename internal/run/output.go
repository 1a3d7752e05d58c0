package run

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/manifest"
)

// What an output directory holds besides its checkpoint directories. A run replaces an output
// as a whole; the entries of carriedOver belong to other commands (the benchmark's history,
// analyze's and plan-sets' results) and move over to the new output.
var (
	outputFiles = []string{manifest.FileName, manifest.RestoreSpecFileName, "catalogue.json"}
	carriedOver = []string{"bench", "analysis.json", "plan.json"}
)

// checkOutput refuses an output path that a run must not replace: a file, or a directory that
// holds anything the pipeline did not write there (an output is replaced as a whole, so
// whatever else is in it would be lost). An absent or empty directory is fine.
func checkOutput(out string) error {
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
		if !slices.Contains(ours, e.Name()) {
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
