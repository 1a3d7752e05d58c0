package manifest

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrVerify reports an output directory whose files do not match its manifest.
var ErrVerify = errors.New("verify failed")

// Verify checks an output directory: the manifest's protocol version, and for every checkpoint
// its meta.json and the size and sha256 of each image file. Every problem is reported, each
// naming the file.
func Verify(outDir string, implementedProtocol int) (*Manifest, error) {
	m, err := Load(filepath.Join(outDir, FileName))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrVerify, err)
	}
	if err := m.CheckProtocol(implementedProtocol); err != nil {
		return m, fmt.Errorf("%w: %w", ErrVerify, err)
	}
	var problems []error
	if m.Spec == "" {
		problems = append(problems, fmt.Errorf("manifest names no restore spec"))
	} else if _, err := readSpec(filepath.Join(outDir, m.Spec)); err != nil {
		problems = append(problems, err)
	}
	for _, c := range m.Checkpoints {
		if c.Dir == "" || filepath.IsAbs(c.Dir) || strings.Contains(c.Dir, "..") {
			problems = append(problems, fmt.Errorf("checkpoint %s: bad dir %q", c.ID, c.Dir))
			continue
		}
		dir := filepath.Join(outDir, c.Dir)
		meta, err := LoadMeta(filepath.Join(dir, MetaFileName))
		if err != nil {
			problems = append(problems, fmt.Errorf("checkpoint %s: %w", c.ID, err))
			continue
		}
		if meta.SpecFingerprint != m.SpecFingerprint {
			problems = append(problems, fmt.Errorf("checkpoint %s: spec fingerprint %s differs from the manifest's %s", c.ID, meta.SpecFingerprint, m.SpecFingerprint))
		}
		for _, name := range ImageFiles() {
			want, ok := meta.Files[name]
			path := filepath.Join(dir, name)
			if !ok {
				problems = append(problems, fmt.Errorf("%s: not listed in meta.json", path))
				continue
			}
			got, err := HashFile(path)
			switch {
			case err != nil:
				problems = append(problems, err)
			case got != want:
				problems = append(problems, fmt.Errorf("%s: %d bytes %s, meta.json says %d bytes %s", path, got.Bytes, got.SHA256, want.Bytes, want.SHA256))
			}
		}
		if !c.Smoke.OK {
			problems = append(problems, fmt.Errorf("checkpoint %s: smoke test did not pass", c.ID))
		}
	}
	if len(problems) > 0 {
		return m, fmt.Errorf("%w: %w", ErrVerify, errors.Join(problems...))
	}
	return m, nil
}

func readSpec(path string) (map[string]any, error) {
	var v map[string]any
	if err := readJSON(path, &v); err != nil {
		return nil, err
	}
	return v, nil
}
