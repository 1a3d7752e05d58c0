package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/limitread"
)

// ErrRestoreSpec reports a restore spec that cannot restore an output's checkpoints: one whose
// shape differs from the one its manifest records, or options that cannot fill it in.
var ErrRestoreSpec = errors.New("restore spec refused")

// maxSocketPath is the longest path a Unix socket address holds (sun_path, 108 bytes with its
// terminating NUL).
const maxSocketPath = 107

// checkSocketPath refuses a host directory whose executor socket path does not fit in a Unix
// socket address: the executor would listen, but its socket would never appear on the host,
// and a dial would only time out.
func checkSocketPath(hostDir string) error {
	if socket := filepath.Join(hostDir, SocketName); len(socket) > maxSocketPath {
		return fmt.Errorf("host dir %q is too long: the socket path %s has %d bytes, a Unix socket address holds %d: the directory must be shorter (the pipeline makes its own under TMPDIR)", hostDir, socket, len(socket), maxSocketPath)
	}
	return nil
}

// RestoreOptions are what a worker's restore spec holds of its own: the only three fields of
// an output's restore-spec.json that a restore may change.
type RestoreOptions struct {
	// Rootfs becomes root.path: the worker's copy of the output's rootfs (the manifest's
	// rootfs.digest names its content), an absolute path that is not a symlink (runsc refuses
	// one).
	Rootfs string
	// HostDir becomes the source of the bind mount on ExecutorDir: a directory of the worker's
	// per sandbox, where the executor's socket appears (HostDir/executor.sock, which must fit
	// in a Unix socket address: 107 bytes).
	HostDir string
	// Env are KEY=VALUE entries of the restored executor's environment: each replaces the
	// spec's entry of the same name, or comes after them. After a restore the executor's
	// os.environ is exactly the result (the executor reads /proc/gvisor/spec_environ).
	Env []string
}

// ReadSpec reads an output's restore spec (restore-spec.json, the manifest's spec) and checks
// that its shape has the fingerprint the manifest records: fingerprint is its
// spec_fingerprint and runscFlags its runsc_flags, whose network and overlay the fingerprint
// covers. The error names the fields that differ, when this package's own sandbox shape
// gives the recorded fingerprint (the same pipeline made it); or it says that none matches.
func ReadSpec(path, fingerprint string, runscFlags []string) (*specs.Spec, error) {
	flags, err := ParseFlags(runscFlags)
	if err != nil {
		return nil, fmt.Errorf("%w: the manifest's runsc_flags: %w", ErrRestoreSpec, err)
	}
	data, err := limitread.OutputFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRestoreSpec, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("%w: parse %s: %w", ErrRestoreSpec, path, err)
	}
	have, err := Fingerprint(&spec, flags)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRestoreSpec, path, err)
	}
	if have != fingerprint {
		return nil, fmt.Errorf("%w: %s: fingerprint %s, the manifest records %s%s", ErrRestoreSpec, path, have, fingerprint, explainFingerprint(&spec, flags, fingerprint))
	}
	for key := range spec.Annotations {
		if strings.HasPrefix(key, annotationCheckpointPrefix) {
			// runsc would try to save again over the image it restores: "file exists".
			return nil, fmt.Errorf("%w: %s: carries the capture annotation %s", ErrRestoreSpec, path, key)
		}
	}
	if err := checkCanonical(&spec); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRestoreSpec, path, err)
	}
	return &spec, nil
}

// checkCanonical refuses a spec that is not this package's sandbox spec with only root.path,
// the executor mount's source and process.env changed. The fingerprint alone covers the shape
// a restore must match, not what runsc would do for whoever wrote the file: hooks run on the
// host as root, annotations and further mounts change the sandbox.
func checkCanonical(s *specs.Spec) error {
	mount, err := executorMount(s)
	if err != nil {
		return err
	}
	if s.Root == nil || !filepath.IsAbs(s.Root.Path) || !filepath.IsAbs(mount.Source) || s.Process == nil {
		return errors.New("no absolute root path, executor mount source or process")
	}
	// The image's cwd and user are the spec's own: the fingerprint, checked before, covers them.
	want, err := Spec(SpecOptions{Mode: ModeSandbox, Rootfs: s.Root.Path, HostDir: mount.Source, Process: Process{Cwd: s.Process.Cwd, User: s.Process.User}})
	if err != nil {
		return err
	}
	for _, kv := range s.Process.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
		}
	}
	want.Process.Env = s.Process.Env
	have, canonical := topLevel(s), topLevel(want)
	var differ []string
	for field := range have {
		if have[field] != canonical[field] {
			differ = append(differ, field)
		}
	}
	for field := range canonical {
		if _, ok := have[field]; !ok {
			differ = append(differ, field)
		}
	}
	if len(differ) > 0 {
		slices.Sort(differ)
		return fmt.Errorf("differs from the pipeline's sandbox spec in %s (only root.path, the source of the mount on %s and process.env may change)", strings.Join(differ, ", "), ExecutorDir)
	}
	return nil
}

// topLevel returns the JSON of each top-level field of s, to compare two specs field by field.
func topLevel(s *specs.Spec) map[string]string {
	data, _ := json.Marshal(s)
	var raw map[string]json.RawMessage
	json.Unmarshal(data, &raw)
	fields := make(map[string]string, len(raw))
	for k, v := range raw {
		fields[k] = string(v)
	}
	return fields
}

// RestoreSpec returns the spec a worker restores an output's checkpoints with: the output's
// restore spec, checked as ReadSpec checks it, with exactly root.path, the source of the bind
// mount on ExecutorDir and process.env replaced from o, nothing else. Write it as config.json
// of the sandbox's bundle.
func RestoreSpec(path, fingerprint string, runscFlags []string, o RestoreOptions) (*specs.Spec, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	spec, err := ReadSpec(path, fingerprint, runscFlags)
	if err != nil {
		return nil, err
	}
	return FillRestoreSpec(spec, o)
}

// FillRestoreSpec is RestoreSpec on a spec that ReadSpec returned, read and checked once for
// many sandboxes: a copy of spec with exactly root.path, the executor mount's source and
// process.env replaced from o. spec itself is left as it is.
func FillRestoreSpec(spec *specs.Spec, o RestoreOptions) (*specs.Spec, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var filled specs.Spec
	if err := json.Unmarshal(data, &filled); err != nil {
		return nil, err
	}
	mount, err := executorMount(&filled)
	if err == nil && (filled.Root == nil || filled.Process == nil) {
		err = errors.New("no root or no process")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRestoreSpec, err)
	}
	filled.Root.Path = o.Rootfs
	mount.Source = o.HostDir
	filled.Process.Env = mergeEnv(filled.Process.Env, o.Env)
	return &filled, nil
}

func (o RestoreOptions) check() error {
	var problems []string
	if !filepath.IsAbs(o.Rootfs) {
		problems = append(problems, fmt.Sprintf("rootfs %q is not an absolute path", o.Rootfs))
	}
	if !filepath.IsAbs(o.HostDir) {
		problems = append(problems, fmt.Sprintf("host dir %q is not an absolute path", o.HostDir))
	} else if err := checkSocketPath(o.HostDir); err != nil {
		problems = append(problems, err.Error())
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			problems = append(problems, fmt.Sprintf("environment entry %q is not KEY=VALUE", kv))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrRestoreSpec, strings.Join(problems, "; "))
	}
	return nil
}

// executorMount returns the spec's bind mount on ExecutorDir, the one mount whose source a
// restore changes.
func executorMount(s *specs.Spec) (*specs.Mount, error) {
	var found *specs.Mount
	for i := range s.Mounts {
		if s.Mounts[i].Destination != ExecutorDir {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("two mounts on %s", ExecutorDir)
		}
		found = &s.Mounts[i]
	}
	if found == nil || found.Type != "bind" {
		return nil, fmt.Errorf("no bind mount on %s, where the executor's socket is", ExecutorDir)
	}
	return found, nil
}

// mergeEnv returns base with each entry of extra replacing base's of the same name, in place,
// or appended.
func mergeEnv(base, extra []string) []string {
	out := append([]string{}, base...)
	for _, kv := range extra {
		name, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, have := range out {
			if strings.HasPrefix(have, name+"=") {
				out[i], replaced = kv, true
				break
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

// explainFingerprint says why s does not have the recorded fingerprint: the fields of its
// shape that differ from this package's sandbox shape, when that shape gives the recorded
// fingerprint with the same flags.
func explainFingerprint(s *specs.Spec, flags Flags, recorded string) string {
	hostDir := "/"
	if m, err := executorMount(s); err == nil && filepath.IsAbs(m.Source) {
		hostDir = m.Source
	}
	rootfs := "/"
	if s.Root != nil && filepath.IsAbs(s.Root.Path) {
		rootfs = s.Root.Path
	}
	// The captured shape is the default rootfs's, or an image's with this spec's cwd and user.
	var ref *specs.Spec
	for _, process := range []Process{{}, {Cwd: s.Process.Cwd, User: s.Process.User}} {
		candidate, err := Spec(SpecOptions{Mode: ModeSandbox, Rootfs: rootfs, HostDir: hostDir, Process: process})
		if err != nil {
			continue
		}
		if fp, err := Fingerprint(candidate, flags); err == nil && fp == recorded {
			ref = candidate
			break
		}
	}
	if ref == nil {
		return fmt.Sprintf(" (with the manifest's runsc flags %q, neither this spec nor this pipeline's sandbox shape gives it: the flags or the spec were changed, or another version of the pipeline made the output)", flags.Args())
	}
	differ := shapeOf(s, flags).differences(shapeOf(ref, flags))
	if len(differ) == 0 {
		return ""
	}
	return fmt.Sprintf(" (it differs from the captured shape in %s)", strings.Join(differ, ", "))
}

// differences names the fields of the shape that differ from other's.
func (sh shape) differences(other shape) []string {
	var names []string
	a, b := reflect.ValueOf(sh), reflect.ValueOf(other)
	for i := range a.NumField() {
		x, _ := json.Marshal(a.Field(i).Interface())
		y, _ := json.Marshal(b.Field(i).Interface())
		if string(x) != string(y) {
			name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
	}
	return names
}
