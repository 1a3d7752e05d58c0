package run

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// Basis is what every set of a capture shares, computed once before the plan and passed to
// every stage after it: the typed runsc flags (strings only in the key and the manifest), the
// restore spec and its fingerprint, the rootfs, what the checkpoints need of a host's CPU,
// and the key inputs every set's key starts from.
type Basis struct {
	Flags        sandbox.Flags
	RestoreFlags []string
	Rootfs       manifest.Rootfs
	// Image names the user's image Rootfs was made from, if it was; Process is its config's
	// environment, cwd and user (nil for the default rootfs).
	Image   *manifest.Image
	Process *sandbox.Process
	// PythonPath and Python are the rootfs's python3, as its probe found it.
	PythonPath string
	Python     *manifest.Python
	// RestoreSpec is the spec a worker restores with (restore-spec.json); Fingerprint is its
	// sandbox.Fingerprint with Flags (the manifest's spec_fingerprint).
	RestoreSpec *specs.Spec
	Fingerprint string
	// CPU is what the checkpoints will need of a host's CPU (the manifest's cpu);
	// CPUIDFaulting says whether this host has CPUID faulting (asked only with a baseline).
	CPU           manifest.CPU
	CPUIDFaulting bool
	// Key holds the key inputs every set shares; a set's key adds its imports (KeyOf).
	Key store.KeyInputs
}

// KeyOf is the key of a set with imports, and its parts (store.KeyInputs).
func (b *Basis) KeyOf(imports []string) (string, map[string]string) {
	in := b.Key
	in.Imports = slices.Clone(imports)
	return in.Key(), in.Parts()
}

// restoreShape is the restore spec of sandboxes on rootfs running process (the image's
// environment, cwd and user), with its fingerprint under flags: what the manifest records,
// the key covers and a run over an output checks.
func restoreShape(rootfs string, process sandbox.Process, flags sandbox.Flags) (*specs.Spec, string, error) {
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: rootfs, HostDir: RestoreSpecHostDir, Process: process})
	if err != nil {
		return nil, "", err
	}
	fingerprint, err := sandbox.Fingerprint(spec, flags)
	if err != nil {
		return nil, "", err
	}
	return spec, fingerprint, nil
}

// Basis computes the basis of a capture on e's rootfs (PrepareRootfs first): it asks runsc
// for this host's CPU features.
func (e *Env) Basis(ctx context.Context) (*Basis, error) {
	need, err := cpuNeeds(ctx, e.Runtime.Path, e.Config, e.controls)
	if err != nil {
		return nil, err
	}
	faulting := false
	if e.Config.CPUBaseline != nil {
		if faulting, err = cpu.CPUIDFaulting(cpu.CPUInfo); err != nil {
			return nil, err
		}
	}
	return newBasis(e, need, faulting)
}

// newBasis is the basis of a capture with e's runsc flags, restore flags, rootfs, runsc
// binary and config, on a host whose CPU the checkpoints need as need says.
func newBasis(e *Env, need manifest.CPU, cpuidFaulting bool) (*Basis, error) {
	spec, fingerprint, err := restoreShape(e.Rootfs.Path, e.RootfsInfo.SandboxProcess(), e.Runtime.Flags)
	if err != nil {
		return nil, err
	}
	b := &Basis{
		Flags: e.Runtime.Flags, RestoreFlags: slices.Clone(e.RestoreFlags), Rootfs: e.Rootfs, Image: e.Image,
		RestoreSpec: spec, Fingerprint: fingerprint, CPU: need, CPUIDFaulting: cpuidFaulting,
		PythonPath: sandbox.PythonPath,
	}
	if info := e.RootfsInfo; info != nil {
		if !info.SandboxProcess().IsZero() {
			b.Process = info.Process
		}
		if info.PythonPath != "" { // a rootfs made before it was recorded: Debian's
			b.PythonPath, b.Python = info.PythonPath, info.Python
		}
	}
	b.Key = store.KeyInputs{
		Schema:            store.KeySchema,
		RunscSHA256:       e.RunscSHA256,
		RunscFlags:        b.Flags.Args(),
		CheckpointOptions: e.Config.Runsc.CheckpointOptions,
		SpecFingerprint:   fingerprint,
		RootfsDigest:      b.Rootfs.Digest,
		ExecutorProtocol:  executorproto.Version,
		PassEnv:           store.PassEnvValues(e.Config.PassEnv, os.LookupEnv),
		CPU:               store.CPU{Features: strings.Join(need.Features, ","), CacheLine: need.CacheLine, Controls: need.Controls},
		ImageConfig:       b.Process,
	}
	return b, nil
}

// cpuNeeds is what the checkpoints of a run will need of a host's CPU: this host's features
// (asked of the runsc at runscPath), or the config's baseline, which must be part of them, and
// this host's cache line, which every host type of the baseline's file that names one must
// share; controls are the baseline's library controls.
func cpuNeeds(ctx context.Context, runscPath string, cfg *config.Config, controls map[string]string) (manifest.CPU, error) {
	host, err := cpu.ReadHost(ctx, runscPath, cfg.Timeouts.RunscCommand)
	if err != nil {
		return manifest.CPU{}, err
	}
	need := manifest.CPU{Features: host.Features, CacheLine: host.CacheLine}
	b := cfg.CPUBaseline
	if b == nil {
		return need, nil
	}
	if missing := cpu.Missing(b.Features, host.Features); len(missing) > 0 {
		return manifest.CPU{}, fmt.Errorf("%w: cpu_baseline names features this host lacks: %s (a sandbox can only be given features of the host it runs on: build on a host that has them, or leave them out of the baseline)", ErrSetup, strings.Join(missing, ", "))
	}
	for i, h := range b.Hosts {
		if h.CacheLine != 0 && h.CacheLine != host.CacheLine {
			return manifest.CPU{}, fmt.Errorf("%w: cpu_baseline.file %s: host type %d has a cache line of %d bytes, this host %d: restore requires them equal, so no checkpoint from here restores there (build one output per cache line)", ErrSetup, b.File, i+1, h.CacheLine, host.CacheLine)
		}
	}
	need.Features, need.Baseline, need.Controls = b.Features, b.Features, controls
	return need, nil
}
