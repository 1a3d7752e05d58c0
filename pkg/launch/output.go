package launch

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrOutput reports an output that cannot be restored at all: a manifest that does not load,
// speaks another protocol, or names flags, a rootfs, a restore spec or a set the kit refuses;
// or files that do not verify. A worker takes it for bad input.
var ErrOutput = errors.New("output refused")

// OpenOptions say how OpenOutput takes an output.
type OpenOptions struct {
	// Rootfs is this host's copy of the output's rootfs, the root of every sandbox; "" means
	// the manifest's rootfs.path. Either way it must record the manifest's rootfs.digest
	// (manifest.CheckRootfs), which keeps a manifest from pointing the root at a directory that
	// is no rootfs of the pipeline; it reads the record, not the files, so restore onto a
	// rootfs this host built or verified itself, never merely the one a manifest names.
	Rootfs string
	// Verify checks every byte of the output against its manifest (manifest.Verify) before
	// anything of it runs: what a worker does with an output someone else pushed.
	Verify bool
	// ColdFallback asks that a set whose checkpoint cannot be used be started cold rather than
	// refused (Restorer.ColdStart: a fresh sandbox, the executor started from nothing, the set's
	// modules imported): a checkpoint whose files do not verify then leaves the output open,
	// marked (Output.Unusable), and a failed restore of a checkpoint starts the set cold
	// (Restorer.Restore). The output's own files (the manifest, the restore spec) must still
	// pass every check: a cold start runs the restore spec.
	ColdFallback bool
}

// Output is an output directory opened once for restores (OpenOutput): its manifest, checked;
// its runsc flags, parsed against the kit's allow-list; the rootfs its sandboxes restore onto;
// and its restore spec, read and checked once.
type Output struct {
	Dir      string
	Manifest *manifest.Manifest
	// Flags are runsc's global flags the checkpoints were made with: a Runtime that restores
	// them has these (Restorer refuses another).
	Flags  sandbox.Flags
	Rootfs string
	spec   *specs.Spec
	// coldFallback is OpenOptions.ColdFallback; unusable holds, by set, why its checkpoint's
	// files did not verify (with ColdFallback alone: otherwise the output is refused).
	coldFallback bool
	unusable     map[string]error
}

// OpenOutput loads the output in dir (its manifest.json) and opens it as NewOutput does.
func OpenOutput(dir string, o OpenOptions) (*Output, error) {
	m, err := manifest.Load(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOutput, err)
	}
	return NewOutput(dir, m, o)
}

// NewOutput opens the output in dir whose manifest m a caller has loaded. Every field of it
// that reaches runsc (as root) or the host is checked before anything runs, never passed
// through, so a worker's code holds none of these checks of its own:
//
//   - the executor protocol (CheckProtocol with executorproto.Version);
//   - runsc_flags and restore_flags against the kit's allow-list (sandbox.ParseFlags,
//     sandbox.CheckRestoreFlags: only the flags and values the pipeline writes, no
//     --network=host, no --debug-log or other path on the host);
//   - the rootfs (o.Rootfs, or the manifest's) records the manifest's digest (CheckRootfs);
//   - with o.Verify, every byte against the manifest (manifest.Verify's checks: each
//     checkpoint by manifest.VerifyCheckpoint; with o.ColdFallback a checkpoint that fails is
//     marked, Output.Unusable, and its set starts cold, rather than the output refused);
//   - the restore spec, read once: its fingerprint recomputed with the manifest's runsc flags
//     and equal to spec_fingerprint, no capture annotations, nothing but the pipeline's own
//     sandbox spec (no OCI hooks, which runsc would run on the host as root; no other mounts,
//     resources, which are the worker's (Options.Limits), or annotations) but for root.path, the executor mount's source and process.env
//     (sandbox.ReadSpec);
//   - the spec's process user is the one the output records for its image (the manifest's
//     process; root for the default rootfs): a restore spec cannot choose whom the host
//     directory of its sandboxes is handed to.
//
// Every error wraps ErrOutput (and the restore spec's, sandbox.ErrRestoreSpec).
func NewOutput(dir string, m *manifest.Manifest, o OpenOptions) (*Output, error) {
	fail := func(err error) (*Output, error) { return nil, fmt.Errorf("%w: %w", ErrOutput, err) }
	if err := m.CheckProtocol(executorproto.Version); err != nil {
		return fail(err)
	}
	flags, err := sandbox.ParseFlags(m.RunscFlags)
	if err != nil {
		return fail(fmt.Errorf("the manifest's runsc_flags: %w", err))
	}
	if err := sandbox.CheckRestoreFlags(m.RestoreFlags); err != nil {
		return fail(fmt.Errorf("the manifest's restore_flags: %w", err))
	}
	rootfs := o.Rootfs
	if rootfs == "" {
		rootfs = m.Rootfs.Path
	}
	if err := m.CheckRootfs(rootfs); err != nil {
		return fail(err)
	}
	// Each checkpoint verified on its own (the manifest's protocol is checked above, the
	// restore spec by ReadSpec below: together manifest.Verify), so that with ColdFallback
	// one whose files fail leaves the others usable.
	unusable := map[string]error{}
	if o.Verify {
		var problems []error
		for _, c := range m.Checkpoints {
			if err := manifest.VerifyCheckpoint(dir, m, c); err != nil {
				unusable[c.ID] = fmt.Errorf("checkpoint %s: %w", c.ID, err)
				problems = append(problems, err)
			}
		}
		if len(problems) > 0 && !o.ColdFallback {
			return fail(errors.Join(problems...))
		}
	}
	if m.Spec == "" {
		return fail(errors.New("the manifest names no restore spec"))
	}
	spec, err := sandbox.ReadSpec(filepath.Join(dir, m.Spec), m.SpecFingerprint, m.RunscFlags)
	if err != nil {
		return fail(err)
	}
	var recorded specs.User // the default rootfs's process is root's
	if m.Process != nil {
		recorded = m.Process.User
	}
	if !sameUser(spec.Process.User, recorded) {
		return fail(fmt.Errorf("%w: %s runs its process as %s, but the output records its image's user as %s", sandbox.ErrRestoreSpec, m.Spec, userString(spec.Process.User), userString(recorded)))
	}
	return &Output{Dir: dir, Manifest: m, Flags: flags, Rootfs: rootfs, spec: spec, coldFallback: o.ColdFallback, unusable: unusable}, nil
}

// Unusable returns why set's checkpoint cannot be restored, its files having failed
// verification (OpenOptions.ColdFallback); nil for one that verified, or was not verified.
func (out *Output) Unusable(set string) error { return out.unusable[set] }

// sameUser reports whether a and b are the same uid, gid and supplementary groups.
func sameUser(a, b specs.User) bool {
	return a.UID == b.UID && a.GID == b.GID && slices.Equal(slices.Sorted(slices.Values(a.AdditionalGids)), slices.Sorted(slices.Values(b.AdditionalGids)))
}

func userString(u specs.User) string {
	s := fmt.Sprintf("uid %d, gid %d", u.UID, u.GID)
	if len(u.AdditionalGids) > 0 {
		s += fmt.Sprintf(", groups %v", u.AdditionalGids)
	}
	return s
}

// Checkpoint returns the checkpoint of set, or an error (ErrOutput) when the output has none.
func (out *Output) Checkpoint(set string) (*manifest.Checkpoint, error) {
	for i := range out.Manifest.Checkpoints {
		if c := &out.Manifest.Checkpoints[i]; c.ID == set {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: %s has no checkpoint %q", ErrOutput, out.Dir, set)
}

// Image returns what a restore of set restores: its directory and the manifest's restore
// flags.
func (out *Output) Image(set string) (Image, error) {
	c, err := out.Checkpoint(set)
	if err != nil {
		return Image{}, err
	}
	return Image{Dir: filepath.Join(out.Dir, c.Dir), Flags: slices.Clone(out.Manifest.RestoreFlags)}, nil
}

// Spec returns the spec of a sandbox of this output whose executor mount's source is hostDir:
// the restore spec read once, with the rootfs, hostDir and env over its environment
// (sandbox.FillRestoreSpec).
func (out *Output) Spec(hostDir string, env []string) (*specs.Spec, error) {
	return sandbox.FillRestoreSpec(out.spec, sandbox.RestoreOptions{Rootfs: out.Rootfs, HostDir: hostDir, Env: env})
}

// ErrHost reports a checkpoint this host cannot restore: another runsc (its version, its
// sha256, its sentry), another executor protocol, CPU features it lacks or another cache line.
var ErrHost = errors.New("does not restore on this host")

// CheckHost asks whether set's checkpoint restores on this host, with the runsc of rt
// (manifest.ReadHost, each command bounded by rt's CommandTimeout; manifest.CheckHost): the
// runsc version string, which restore compares exactly, and the binary's sha256; the helpers
// rt's sandboxes boot with (Runtime.HelpersDir, or gvisor-bin/ beside runsc) against the
// manifest's runsc.helpers; the executor protocol; the CPU features and the cache line. It
// returns the warnings (an unenforced CPU baseline, a missing helper, a host with fewer CPUs
// than the checkpoints' sandboxes saw), which do not stop a restore, or an error matching
// ErrHost that names every problem.
func (out *Output) CheckHost(ctx context.Context, rt *Runtime, set string) (warnings []string, err error) {
	if _, err := out.Checkpoint(set); err != nil {
		return nil, err
	}
	host, err := manifest.ReadHost(ctx, rt.Driver()) // the helpers rt's sandboxes boot with (Runtime.HelpersDir)
	if err != nil {
		return nil, err
	}
	for _, v := range manifest.CheckHost(out.Manifest, host).Checkpoints {
		if v.ID != set {
			continue
		}
		if !v.Restores {
			return v.Warnings, fmt.Errorf("checkpoint %s %w: %s", set, ErrHost, strings.Join(v.Problems, "; "))
		}
		return v.Warnings, nil
	}
	return nil, fmt.Errorf("checkpoint %s %w: the host check gave it no verdict", set, ErrHost)
}
