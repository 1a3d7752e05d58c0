package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrVerify reports an output directory whose files do not match its manifest.
var ErrVerify = errors.New("verify failed")

// ErrFileMismatch reports an image file that is missing, not listed in meta.json, or whose size
// or sha256 differs from what meta.json records.
var ErrFileMismatch = errors.New("image file does not match meta.json")

// CheckFiles checks every image file in dir against meta: listed, present, its size (first,
// cheaply: a half-written file is caught before it is hashed), then its sha256. It returns the
// problems in the order of ImageFiles, each naming the file: one matching ErrFileMismatch
// shows the file wrong; any other (EACCES, EIO) says nothing about the file. It is the one
// check of image files, for Verify and for the checkpoint store.
func CheckFiles(dir string, meta *Meta) []error {
	var problems []error
	for _, name := range ImageFiles() {
		want, ok := meta.Files[name]
		path := filepath.Join(dir, name)
		if !ok {
			problems = append(problems, fmt.Errorf("%w: %s: not listed in meta.json", ErrFileMismatch, path))
			continue
		}
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			problems = append(problems, fmt.Errorf("%w: %w", ErrFileMismatch, err))
			continue
		case err != nil:
			problems = append(problems, err)
			continue
		case fi.Size() != want.Bytes:
			problems = append(problems, fmt.Errorf("%w: %s: %d bytes, meta.json says %d", ErrFileMismatch, path, fi.Size(), want.Bytes))
			continue
		}
		size, sum, err := filedigest.Of(path)
		got := File{Bytes: size, SHA256: sum}
		switch {
		case err != nil:
			problems = append(problems, err)
		case got != want:
			problems = append(problems, fmt.Errorf("%w: %s: %d bytes %s, meta.json says %d bytes %s", ErrFileMismatch, path, got.Bytes, got.SHA256, want.Bytes, want.SHA256))
		}
	}
	return problems
}

// Verify checks an output directory: the manifest's protocol version and paths; that the
// restore spec has the fingerprint the manifest records; and for every checkpoint its
// meta.json (fingerprint and runsc version), the runsc version in checkpoint.img's own header,
// and the size and sha256 of each image file. Every problem is reported, each naming the file.
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
	} else if err := checkSpec(filepath.Join(outDir, m.Spec), m); err != nil {
		problems = append(problems, err)
	}
	for _, c := range m.Checkpoints {
		problems = append(problems, verifyCheckpoint(filepath.Join(outDir, c.Dir), c, m)...)
	}
	if len(problems) > 0 {
		return m, fmt.Errorf("%w: %w", ErrVerify, errors.Join(problems...))
	}
	return m, nil
}

// checkSpec checks that the restore spec at path has the manifest's fingerprint (recomputed
// with the manifest's runsc flags): a spec edited after the capture would be refused by runsc
// at restore time.
func checkSpec(path string, m *Manifest) error {
	_, err := sandbox.ReadSpec(path, m.SpecFingerprint, m.RunscFlags)
	return err
}

// VerifyCheckpoint checks the checkpoint c of the output in outDir, whose manifest is m, as
// Verify checks each: its meta.json, checkpoint.img's runsc version, every image file's size
// and sha256, its smoke test. The error names every problem and wraps ErrVerify: for a caller
// that uses the checkpoints that verify and starts the others cold (launch.OpenOptions).
func VerifyCheckpoint(outDir string, m *Manifest, c Checkpoint) error {
	if problems := verifyCheckpoint(filepath.Join(outDir, c.Dir), c, m); len(problems) > 0 {
		return fmt.Errorf("%w: %w", ErrVerify, errors.Join(problems...))
	}
	return nil
}

func verifyCheckpoint(dir string, c Checkpoint, m *Manifest) []error {
	meta, err := LoadMeta(filepath.Join(dir, MetaFileName))
	if err != nil {
		return []error{fmt.Errorf("checkpoint %s: %w", c.ID, err)}
	}
	var problems []error
	if meta.SpecFingerprint != m.SpecFingerprint {
		problems = append(problems, fmt.Errorf("checkpoint %s: spec fingerprint %s differs from the manifest's %s", c.ID, meta.SpecFingerprint, m.SpecFingerprint))
	}
	if m.CPUs != 0 && meta.CPUs != m.CPUs {
		problems = append(problems, fmt.Errorf("checkpoint %s: meta.json says its sandbox saw %d CPUs, the manifest's cpus is %d", c.ID, meta.CPUs, m.CPUs))
	}
	if meta.RunscVersion != m.Runsc.Version {
		problems = append(problems, fmt.Errorf("checkpoint %s: meta.json runsc version %q differs from the manifest's %q", c.ID, meta.RunscVersion, m.Runsc.Version))
	}
	image := filepath.Join(dir, "checkpoint.img")
	if header, err := ReadImageHeader(image); err != nil {
		problems = append(problems, err)
	} else if header.RunscVersion() != m.Runsc.Version {
		problems = append(problems, fmt.Errorf("%s: saved by runsc %q, the manifest records %q", image, header.RunscVersion(), m.Runsc.Version))
	}
	problems = append(problems, CheckFiles(dir, meta)...)
	if !c.Smoke.OK {
		problems = append(problems, fmt.Errorf("checkpoint %s: smoke test did not pass", c.ID))
	}
	return problems
}
