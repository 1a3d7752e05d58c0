package outdir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/pkg/atomicfile"
)

// sweepTemporaries removes the temporary files (atomicfile's .NAME.tmp-RAND) that writers of
// the output out killed between create and rename left in it: at its top level (manifest.json,
// catalogue.json, analyze's and plan-sets' files), in its checkpoint directories and in the
// bench history's run directories. They carry no lease: they are written under out's lock,
// which the caller holds exclusively, so every one found is dead. Links are not followed. It
// returns what it removed, one line each, for the log.
func sweepTemporaries(out string) ([]string, error) {
	var did []string
	err := filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == out && os.IsNotExist(err) {
				return fs.SkipAll
			}
			return err
		}
		rel, _ := filepath.Rel(out, path)
		if d.IsDir() && rel != "." && strings.Count(rel, string(filepath.Separator)) >= 2 {
			return fs.SkipDir // OUT/bench/RUN/ is the deepest place a writer writes
		}
		if _, ok := atomicfile.TempOf(d.Name()); !ok || !d.Type().IsRegular() {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove a temporary file that a killed writer left: %w", err)
		}
		did = append(did, "removed a temporary file that a killed writer left: "+path)
		return nil
	})
	return did, err
}
