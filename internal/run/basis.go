package run

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

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
	// CPUs is how many CPUs every capture's sandbox sees (sandbox.cpus; the manifest's cpus).
	CPUs int
	// Key holds the key inputs every set shares; a set's key adds its imports (KeyOf).
	Key store.KeyInputs
}

// KeyOf returns the key of a set with imports, and its parts (store.KeyInputs).
func (b *Basis) KeyOf(imports []string) (string, map[string]string) {
	in := b.Key
	in.Imports = slices.Clone(imports)
	return in.Key(), in.Parts()
}

// restoreShape returns the restore spec of sandboxes on rootfs running process (the image's
// environment, cwd and user), with its fingerprint under flags: what the manifest records,
// the key covers and a run over an output checks. t counts the fingerprints computed.
func restoreShape(rootfs string, process sandbox.Process, flags sandbox.Flags, t *tally) (*specs.Spec, string, error) {
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: rootfs, HostDir: RestoreSpecHostDir, Process: process})
	if err != nil {
		return nil, "", err
	}
	t.fingerprinted()
	fingerprint, err := sandbox.Fingerprint(spec, flags)
	if err != nil {
		return nil, "", err
	}
	return spec, fingerprint, nil
}

// basis returns the basis of a capture on the sandboxes sb: it asks runsc for this host's CPU
// features. A capture computes it once and passes it to every stage.
func (e *Env) basis(ctx context.Context, sb *Sandboxes) (*Basis, error) {
	if err := checkHostCPUs(e.Config.Sandbox.CPUs); err != nil {
		return nil, err
	}
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
	return newBasis(e, sb, need, faulting)
}

// newBasis returns the basis of a capture on the sandboxes sb (runsc flags, restore flags,
// rootfs) with e's runsc binary and config, on a host whose CPU the checkpoints need as need
// says.
func newBasis(e *Env, sb *Sandboxes, need manifest.CPU, cpuidFaulting bool) (*Basis, error) {
	spec, fingerprint, err := sb.shape()
	if err != nil {
		return nil, err
	}
	b := &Basis{
		Flags: sb.Runtime.Flags, RestoreFlags: slices.Clone(sb.RestoreFlags), Rootfs: sb.Rootfs.Rootfs, Image: sb.Rootfs.Image,
		RestoreSpec: spec, Fingerprint: fingerprint, CPU: need, CPUIDFaulting: cpuidFaulting, CPUs: e.Config.Sandbox.CPUs,
		PythonPath: sandbox.PythonPath,
	}
	if info := sb.Rootfs.Info; info != nil {
		if !info.SandboxProcess().IsZero() {
			b.Process = info.Process
		}
		if info.PythonPath != "" { // a rootfs made before it was recorded: Debian's
			b.PythonPath, b.Python = info.PythonPath, info.Python
		}
	}
	b.Key = store.KeyInputs{
		Schema:            store.KeySchema,
		RunscSHA256:       e.Runsc.SHA256,
		RunscHelpers:      e.Runsc.Helpers,
		RunscFlags:        b.Flags.Args(),
		CheckpointOptions: e.Config.Runsc.CheckpointOptions,
		SpecFingerprint:   fingerprint,
		RootfsDigest:      b.Rootfs.Digest,
		ExecutorProtocol:  executorproto.Version,
		PassEnv:           store.PassEnvValues(e.Config.PassEnv, os.LookupEnv),
		CPU:               store.CPU{Features: strings.Join(need.Features, ","), CacheLine: need.CacheLine, Controls: need.Controls},
		CPUs:              b.CPUs,
		ImageConfig:       b.Process,
	}
	return b, nil
}

// cpuNeeds returns what the checkpoints of a run will need of a host's CPU: this host's features
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

// tally counts what a capture makes that it should make once: the files written through the
// writers it wraps (writer), counted where the bytes are written, and the spec fingerprints
// computed. A unit test injects one (Env.tally, and the store's WriteJSON); nil counts
// nothing.
type tally struct {
	fingerprints atomic.Int64
	mu           sync.Mutex
	writes       map[string]int // by path
	// made is the file each write made, by identity: a file found later that is none of them
	// was written some other way, or again.
	made map[fileID]string
}

// fileID is a file's identity: an atomic write makes a new one, a rename keeps it.
type fileID struct{ dev, ino uint64 }

// fileIDOf returns the identity of the file at path.
func fileIDOf(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("%s: no inode", path)
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// writer returns write, counting each file it writes once the bytes are there; write itself
// when t is nil.
func (t *tally) writer(write func(path string, v any) error) func(path string, v any) error {
	if t == nil {
		return write
	}
	return func(path string, v any) error {
		if err := write(path, v); err != nil {
			return err
		}
		id, err := fileIDOf(path)
		if err != nil {
			return err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.writes == nil {
			t.writes, t.made = map[string]int{}, map[fileID]string{}
		}
		t.writes[path]++
		t.made[id] = path
		return nil
	}
}

func (t *tally) fingerprinted() {
	if t != nil {
		t.fingerprints.Add(1)
	}
}
