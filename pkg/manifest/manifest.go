// Package manifest holds the types of manifest.json (one per output directory) and meta.json
// (one per checkpoint), and what a worker checks before it restores any of an output.
//
// A worker takes it through launch.OpenOutput, which does it all once: Load (refuses paths
// outside the output), CheckProtocol with executorproto.Version, Verify (the restore spec's
// fingerprint, every meta.json and image file against the manifest; CheckFiles is the image
// files' part, which the pipeline's store uses too), CheckRootfs, then sandbox.ReadSpec with
// the manifest's SpecFingerprint and RunscFlags (typed: Flags); CheckHost with ReadHost is the
// host's side (launch.Output.CheckHost). ReadImageHeader and
// DecodeImageHeader read gVisor's checkpoint.img header without runsc; ReadRootfsInfo reads
// what a rootfs records of itself (its digest: the manifest's rootfs.digest). It pulls in no
// runsc driver: its only dependency outside the standard library is the OCI runtime-spec.
package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/sandbox"
)

const (
	// FileName is the manifest's name at the root of an output directory.
	FileName = "manifest.json"
	// MetaFileName is the name of each checkpoint directory's metadata.
	MetaFileName = "meta.json"
	// RestoreSpecFileName is the OCI spec a worker restores with.
	RestoreSpecFileName = "restore-spec.json"
)

// ImageFiles returns the files gVisor writes for one checkpoint.
func ImageFiles() []string { return []string{"checkpoint.img", "pages.img", "pages_meta.img"} }

// Runsc identifies the runsc binary that captured the images: restore only accepts an image
// saved by the exact same version string.
type Runsc struct {
	Version string `json:"version"`
	Module  string `json:"module"`
	SHA256  string `json:"sha256"`
	// Helpers are the sha256 digests of the helpers runsc booted the sandboxes with, by name
	// (runsc.HelperNames, gvisor-bin/ beside runsc); none for a runsc without them, and none
	// in a manifest made before they were recorded: not checked then.
	Helpers map[string]string `json:"helpers,omitempty"`
}

// HelpersText returns Helpers as name=digest pairs sorted by name, "none" without any: for
// messages and comparisons.
func (r Runsc) HelpersText() string {
	if len(r.Helpers) == 0 {
		return "none"
	}
	var pairs []string
	for _, name := range slices.Sorted(maps.Keys(r.Helpers)) {
		pairs = append(pairs, name+"="+r.Helpers[name])
	}
	return strings.Join(pairs, " ")
}

// Rootfs identifies the image's root filesystem.
type Rootfs struct {
	Path   string `json:"path"`
	Digest string `json:"digest"`
}

// Image names the OCI image a rootfs was made from: the reference given and the digest of the
// image manifest used; when the reference named an image index, the index's digest and the
// platform chosen in it (os/arch[/variant]).
type Image struct {
	Ref      string `json:"ref"`
	Digest   string `json:"digest"`
	Index    string `json:"index,omitempty"`
	Platform string `json:"platform,omitempty"`
}

// Stats are restore times in milliseconds.
type Stats struct {
	Runs   []float64 `json:"runs"`
	Min    float64   `json:"min"`
	Median float64   `json:"median"`
	P90    float64   `json:"p90"`
	Max    float64   `json:"max"`
}

// Smoke is the result of calling a restored executor.
type Smoke struct {
	OK      bool    `json:"ok"`
	ReadyMS float64 `json:"ready_ms"`
	Error   string  `json:"error,omitempty"`
	// ResidentBytes is the memory the restored sandbox held once it had answered, idle
	// (launch.Memory.Resident: its processes' Pss), and OwnBytes the part of it no other
	// sandbox shares (launch.Memory.Own): what each warm sandbox of the set pins. 0: not
	// measured (a smoke test before it was).
	ResidentBytes int64 `json:"resident_bytes,omitempty"`
	OwnBytes      int64 `json:"own_bytes,omitempty"`
}

// Measured says how restore_ms was measured: timings kept from an earlier run may have been
// taken with other settings than the run that keeps them.
type Measured struct {
	Runs         int      `json:"runs"`
	RestoreFlags []string `json:"restore_flags"`
}

// Checkpoint is one package set's entry in the manifest.
type Checkpoint struct {
	ID      string   `json:"id"`
	Imports []string `json:"imports"`
	Dir     string   `json:"dir"` // relative to the manifest
	Bytes   int64    `json:"bytes"`
	// Key is the checkpoint's cache key: a digest of every input that shapes it; KeyParts
	// digests each input alone, so a changed key can say which input changed.
	Key        string            `json:"key"`
	KeyParts   map[string]string `json:"key_parts"`
	CapturedAt time.Time         `json:"captured_at"`
	RestoreMS  Stats             `json:"restore_ms"`
	// MeasuredWith are the settings restore_ms was measured with (absent in older manifests).
	MeasuredWith *Measured `json:"measured_with,omitempty"`
	Smoke        Smoke     `json:"smoke"`
	// CPUCheck is what the capture saw of the CPU from inside the sandbox (with a baseline).
	CPUCheck *CPUCheck `json:"cpu_check,omitempty"`
	// Packages are the distributions the checkpoint holds loaded, PEP 503 normalized name to
	// version ({"pandas": "2.2.3+dfsg"}), as the executor read them after its imports (absent
	// in checkpoints captured before it did).
	Packages map[string]string `json:"packages,omitempty"`
	// UnmappedModules are the top-level modules it holds loaded that no distribution's
	// metadata names, sorted: their versions are unknown (absent: none, or captured before
	// the executor said).
	UnmappedModules []string `json:"unmapped_modules,omitempty"`
}

// Manifest describes a whole output directory.
type Manifest struct {
	ExecutorProtocol int      `json:"executor_protocol"`
	Runsc            Runsc    `json:"runsc"`
	RunscFlags       []string `json:"runsc_flags"`
	RestoreFlags     []string `json:"restore_flags"`
	// RestoreFlagsConcurrency is legacy: `pipeline bench` once wrote the flags it found fastest
	// into RestoreFlags and the concurrency here. Nothing writes it now (a bench records its
	// recommendation in its own bench.json); it stays so that manifests that have it load.
	RestoreFlagsConcurrency int `json:"restore_flags_concurrency,omitempty"`
	// CheckpointOptions are the gVisor checkpoint annotations the images were captured with.
	CheckpointOptions map[string]string `json:"checkpoint_options"`
	// AlphaMsPerMiB and InterceptMs are the least-squares line of restore median against image
	// size: a cost model for a router.
	AlphaMsPerMiB   float64  `json:"alpha_ms_per_mib"`
	InterceptMs     float64  `json:"intercept_ms"`
	SpecFingerprint string   `json:"spec_fingerprint"`
	ExecutorArgv    []string `json:"executor_argv"`
	// PythonPath is the python3 the executor runs under, found through the sandbox's PATH.
	PythonPath string `json:"python_path"`
	// Python is the interpreter the checkpoints hold (nil in outputs made before it was
	// recorded): a client pickling functions by value checks it (CheckPython).
	Python *Python `json:"python,omitempty"`
	// Process is the image config's environment, cwd and user that every sandbox ran with
	// (absent for the default rootfs); the restore spec holds them too.
	Process *sandbox.Process `json:"process,omitempty"`
	// Manifests from before runsc_flags was the one record of runsc's global flags also
	// carried "overlay" and "network", copies of two of them: they still load (the fields are
	// ignored); Flags reads every flag from runsc_flags.
	RootReadonly bool   `json:"root_readonly"`
	Rootfs       Rootfs `json:"rootfs"`
	// Image is the user's image the rootfs was made from (config image, --image), if any.
	Image *Image `json:"image,omitempty"`
	// CPU is what the checkpoints need of a host's CPU; nil in outputs made before it was
	// recorded.
	CPU *CPU `json:"cpu,omitempty"`
	// CPUs is how many CPUs every checkpoint's sandbox saw (the config's sandbox.cpus): a
	// restored process keeps the count, and libraries sized by it (OpenBLAS's threads) with
	// it; 0 in outputs made before it was pinned.
	CPUs        int          `json:"cpus,omitempty"`
	CreatedAt   time.Time    `json:"created_at"`
	Spec        string       `json:"spec"`
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// File is one image file's size and digest.
type File struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Meta describes one checkpoint directory (in an output, or an entry of the checkpoint store).
type Meta struct {
	ID              string            `json:"id"`
	Imports         []string          `json:"imports"`
	RunscVersion    string            `json:"runsc_version"`
	SpecFingerprint string            `json:"spec_fingerprint"`
	Key             string            `json:"key"`
	KeyParts        map[string]string `json:"key_parts"`
	CapturedAt      time.Time         `json:"captured_at"`
	Files           map[string]File   `json:"files"`
	// RestoreMS are the timings measured when it was captured, kept with a stored entry so a
	// reuse can keep them.
	RestoreMS    *Stats    `json:"restore_ms,omitempty"`
	MeasuredWith *Measured `json:"measured_with,omitempty"`
	// CPUCheck is what the capture saw of the CPU from inside the sandbox (with a baseline).
	CPUCheck *CPUCheck `json:"cpu_check,omitempty"`
	// CPUs is how many CPUs the capture's sandbox saw, which the checkpoint keeps (0 in
	// checkpoints captured before the executor said).
	CPUs int `json:"cpus,omitempty"`
	// Packages are the distributions the checkpoint holds loaded, PEP 503 normalized name to
	// version ({"pandas": "2.2.3+dfsg"}), as the executor read them after its imports (absent
	// in checkpoints captured before it did).
	Packages map[string]string `json:"packages,omitempty"`
	// UnmappedModules are the top-level modules it holds loaded that no distribution's
	// metadata names, sorted: their versions are unknown (absent: none, or captured before
	// the executor said).
	UnmappedModules []string `json:"unmapped_modules,omitempty"`
}

// Bytes returns the total size of the checkpoint's image files.
func (m *Meta) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Bytes
	}
	return n
}

// ErrProtocol reports a manifest written for another executor protocol version.
var ErrProtocol = errors.New("executor protocol mismatch")

// Flags returns runsc's global flags the checkpoints were made with, read from runsc_flags: a
// run over the output restores with them.
func (m *Manifest) Flags() (sandbox.Flags, error) { return sandbox.ParseFlags(m.RunscFlags) }

// CheckProtocol refuses a manifest whose executor protocol differs from the one implemented.
// A manifest without the field predates it and counts as version 1.
func (m *Manifest) CheckProtocol(implemented int) error {
	have := m.ExecutorProtocol
	if have == 0 {
		have = 1
	}
	if have != implemented {
		return fmt.Errorf("%w: the artifacts speak executor protocol %d, this worker implements %d; rebuild the worker image with the current pipeline", ErrProtocol, have, implemented)
	}
	return nil
}

// ErrInvalid reports a manifest or meta.json that names files outside its own output
// directory, or a checkpoint id that is not one (checkpointid).
var ErrInvalid = errors.New("invalid manifest")

// Load reads a manifest and refuses one whose restore spec or checkpoint directories are not
// local paths inside the output directory, or whose checkpoint ids are not ids (or repeat):
// workers and the pipeline open what it names, and make directories named after its ids.
func Load(path string) (*Manifest, error) {
	var m Manifest
	if err := readJSON(path, &m); err != nil {
		return nil, err
	}
	if err := m.checkPaths(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &m, nil
}

// local reports whether p names something strictly inside the output directory.
func local(p string) bool { return filepath.IsLocal(p) && filepath.Clean(p) != "." }

func (m *Manifest) checkPaths() error {
	var problems []error
	if m.Spec != "" && !local(m.Spec) {
		problems = append(problems, fmt.Errorf("%w: spec %q is not a path inside the output", ErrInvalid, m.Spec))
	}
	seen := map[string]bool{}
	for i, c := range m.Checkpoints {
		if err := checkpointid.Check(c.ID); err != nil {
			problems = append(problems, fmt.Errorf("%w: checkpoints[%d]: %w", ErrInvalid, i, err))
			continue
		}
		if seen[c.ID] {
			problems = append(problems, fmt.Errorf("%w: checkpoints[%d]: duplicate id %q", ErrInvalid, i, c.ID))
		}
		seen[c.ID] = true
		if !local(c.Dir) {
			problems = append(problems, fmt.Errorf("%w: checkpoint %s: dir %q is not a path inside the output", ErrInvalid, c.ID, c.Dir))
		}
	}
	return errors.Join(problems...)
}

// LoadMeta reads a checkpoint's meta.json and refuses one whose id is not an id.
func LoadMeta(path string) (*Meta, error) {
	var m Meta
	if err := readJSON(path, &m); err != nil {
		return nil, err
	}
	if err := checkpointid.Check(m.ID); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, ErrInvalid, err)
	}
	return &m, nil
}

// readJSON reads an output's JSON file at path into v, within limitread.OutputJSON.
func readJSON(path string, v any) error {
	data, err := limitread.OutputFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}
