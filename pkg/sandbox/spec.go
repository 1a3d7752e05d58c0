// Package sandbox is the one place that knows how an executor sandbox is shaped, so capture,
// measure, the smoke test and a worker all build the same shape: restore requires the shape
// to match the capture exactly. It does not run anything (pkg/runsc drives runsc).
//
// For the pipeline: Spec builds the OCI runtime spec of a mode (SpecOptions), Fingerprint
// digests what a restore requires to match, Flags are the runsc global flags that shape a
// sandbox (Args, ParseFlags).
//
// For a worker: RestoreSpec turns an output's restore-spec.json, the manifest's
// spec_fingerprint and runsc_flags, and the worker's rootfs, host directory and environment
// (RestoreOptions) into the spec to restore with, checked; ReadSpec is its check alone.
// ExecutorDir, SocketName and ExecutorArgs are the executor's side of the contract.
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/filedigest"
)

// Mode selects the executor's startup path (the EXECUTOR_MODE of the protocol spec).
type Mode string

const (
	ModeCapture Mode = "capture"
	ModeMeasure Mode = "measure"
	ModeSandbox Mode = "sandbox"
)

const (
	// ExecutorDir is EXECUTOR_DIR inside the sandbox, the bind mount of a host directory where
	// the executor binds executor.sock.
	ExecutorDir = "/run/readie"
	// SocketName is the executor's socket file inside ExecutorDir.
	SocketName = "executor.sock"
	// PythonPath is the interpreter the executor runs under in the default rootfs (Debian's);
	// in an image, the python3 its PATH finds (the manifest's python_path).
	PythonPath = "/usr/bin/python3"

	annotationCheckpointPrefix = "dev.gvisor.internal.checkpoint."
	annotationCheckpointEnable = annotationCheckpointPrefix + "enable"
	annotationCheckpointPath   = annotationCheckpointPrefix + "path"
	// AnnotationCPUFeatures gives a sandbox only the listed CPU features (and the host's that
	// are among them): an allow-list of gVisor's names, saved with a checkpoint.
	AnnotationCPUFeatures = "dev.gvisor.internal.cpufeatures"

	maxOpenFiles = 1024
	// ociVersion is the spec version every sandbox spec declares: pinned, so that an upgrade of
	// the runtime-spec module does not make restore specs of earlier outputs differ
	// (RestoreSpec compares the whole spec).
	ociVersion = "1.3.0"
)

// ExecutorArgs returns the executor's argv, a fresh slice each call: no caller can change it.
func ExecutorArgs() []string { return []string{"python3", "-u", "-m", "readie_executor"} }

// SpecOptions describes one sandbox.
type SpecOptions struct {
	Mode Mode
	// Rootfs is the image's root filesystem (absolute path); mounted read-only.
	Rootfs string
	// HostDir is the per-sandbox host directory bind-mounted on ExecutorDir. Empty only with
	// Args: a sandbox that runs something other than the executor then has no host directory
	// at all, and runsc makes no mount point in the root for one.
	HostDir string
	// ImageDir is where gVisor writes the checkpoint (capture mode only).
	ImageDir string
	// Imports are the modules the executor imports before the checkpoint (capture mode only).
	Imports []string
	// CheckpointOptions are extra gVisor checkpoint annotations, named without their
	// "dev.gvisor.internal.checkpoint." prefix, e.g. "exclude-committed-zero-pages" (capture only).
	CheckpointOptions map[string]string
	// Process is the image's: its Env under the pipeline's variables, its cwd and its user
	// (the zero Process for the default rootfs). Nothing of the pipeline's own environment is
	// passed on: a checkpoint ships to every sandbox, secrets included.
	Process Process
	// Env adds KEY=VALUE entries over the base environment; restore may differ here.
	Env []string
	// CPUFeatures, when not nil, are the only CPU features the sandbox is given (capture mode
	// only: a checkpoint keeps them). gVisor's names; runsc refuses any other with a message
	// that says nothing, so they are checked here.
	CPUFeatures []string
	// CPUs, when above 0, is how many CPUs the sandbox sees (capture mode only: a checkpoint
	// keeps the count its sandbox saw, and a restore cannot change it). runsc takes the count
	// from the sandbox's cgroup: the CPUs of its cpuset, lowered by a CPU quota
	// (--cpu-num-from-quota, runsc's default) to no fewer than 2. So 2 or more is a quota of
	// that many CPUs, and 1 a cpuset of SingleCPU alone. A host with fewer CPUs than the
	// quota gives fewer: the caller checks what the sandbox saw.
	CPUs int
	// SingleCPU is the host CPU a sandbox of one CPU runs on (CPUs 1 only): one the caller may
	// use, from its own affinity.
	SingleCPU int
	// Args replaces the executor's argv, for a sandbox of the same shape running something else
	// (the benchmark's floor runs /bin/true). A restore spec never sets it.
	Args []string
}

// ErrSpec reports options that cannot make a sandbox.
var ErrSpec = errors.New("sandbox: invalid spec options")

// Spec returns the OCI runtime spec of an executor sandbox.
func Spec(o SpecOptions) (*specs.Spec, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	var extra []string
	if o.Mode == ModeCapture {
		extra = append(extra, PreimportEnv+"="+strings.Join(o.Imports, ","))
	}
	env := o.Process.env(o.Mode, append(extra, o.Env...))
	args := ExecutorArgs()
	if o.Args != nil {
		args = slices.Clone(o.Args)
	}
	caps := []string{"CAP_KILL", "CAP_NET_BIND_SERVICE"}
	return &specs.Spec{
		Version:  ociVersion,
		Hostname: "readie",
		Root:     &specs.Root{Path: o.Rootfs, Readonly: true},
		Process: &specs.Process{
			Args: args,
			Env:  env,
			Cwd:  o.Process.cwd(),
			User: o.Process.User,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: maxOpenFiles, Soft: maxOpenFiles},
			},
			NoNewPrivileges: true,
		},
		Mounts: mounts(o.HostDir),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
			Resources: o.resources(),
		},
		Annotations: o.annotations(),
	}, nil
}

// check refuses options that cannot make a sandbox, naming the problem.
func (o SpecOptions) check() error {
	switch o.Mode {
	case ModeCapture, ModeMeasure, ModeSandbox:
	default:
		return fmt.Errorf("%w: unknown mode %q", ErrSpec, o.Mode)
	}
	if !filepath.IsAbs(o.Rootfs) || !filepath.IsAbs(o.HostDir) && (o.HostDir != "" || o.Args == nil) {
		return fmt.Errorf("%w: rootfs %q and host dir %q must be absolute (no host dir only with args)", ErrSpec, o.Rootfs, o.HostDir)
	}
	if o.HostDir != "" {
		if err := checkSocketPath(o.HostDir); err != nil {
			return fmt.Errorf("%w: %w", ErrSpec, err)
		}
	}
	for k := range o.CheckpointOptions {
		if o.Mode != ModeCapture || k == "" || k == "enable" || k == "path" || strings.ContainsAny(k, "/= ") {
			return fmt.Errorf("%w: checkpoint option %q (capture mode only; not enable or path)", ErrSpec, k)
		}
	}
	if (o.Mode == ModeCapture) != (o.ImageDir != "") {
		return fmt.Errorf("%w: an image directory is set exactly in capture mode", ErrSpec)
	}
	if o.CPUFeatures != nil {
		if o.Mode != ModeCapture {
			return fmt.Errorf("%w: CPU features are given in capture mode only (a checkpoint keeps them)", ErrSpec)
		}
		if bad := cpu.Unknown(o.CPUFeatures); len(bad) > 0 {
			return fmt.Errorf("%w: CPU features gVisor does not know: %s", ErrSpec, strings.Join(bad, ", "))
		}
	}
	if o.CPUs != 0 || o.SingleCPU != 0 {
		switch {
		case o.Mode != ModeCapture:
			return fmt.Errorf("%w: a CPU count is given in capture mode only (a checkpoint keeps it)", ErrSpec)
		case o.CPUs < 0 || o.CPUs > maxCPUs:
			return fmt.Errorf("%w: CPU count %d: want 1..%d", ErrSpec, o.CPUs, maxCPUs)
		case o.SingleCPU < 0 || o.SingleCPU != 0 && o.CPUs != 1:
			return fmt.Errorf("%w: a single CPU (%d) is given for a sandbox of one CPU only", ErrSpec, o.SingleCPU)
		}
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrSpec, kv)
		}
	}
	return o.Process.Check()
}

// mounts returns every sandbox's mounts, and the bind mount of hostDir on ExecutorDir when set.
func mounts(hostDir string) []specs.Mount {
	m := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		// A function may want scratch space; the root is read-only.
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
	if hostDir != "" {
		m = append(m, specs.Mount{Destination: ExecutorDir, Type: "bind", Source: hostDir, Options: []string{"rbind", "rw"}})
	}
	return m
}

// annotations returns a capture's: checkpointing enabled into ImageDir, the checkpoint options,
// the CPU features; nil in the other modes.
func (o SpecOptions) annotations() map[string]string {
	if o.Mode != ModeCapture {
		return nil
	}
	a := map[string]string{
		annotationCheckpointEnable: "true",
		annotationCheckpointPath:   o.ImageDir,
	}
	for k, v := range o.CheckpointOptions {
		a[annotationCheckpointPrefix+k] = v
	}
	if o.CPUFeatures != nil {
		a[AnnotationCPUFeatures] = strings.Join(o.CPUFeatures, ",")
	}
	return a
}

// maxCPUs bounds a sandbox's CPU count: gVisor sizes its CPU sets by it.
const maxCPUs = 1024

// resources returns the cgroup resources that make runsc give the sandbox CPUs CPUs (nil when
// not pinned): a quota of that many CPUs, or for one CPU a cpuset of SingleCPU, since runsc
// lowers its count by a quota to no fewer than 2 (runsc/sandbox's createSandboxProcess).
// A restore spec holds none: the restored kernel keeps the count its checkpoint saved, and
// runsc lets a restore change the resources.
func (o SpecOptions) resources() *specs.LinuxResources {
	switch {
	case o.CPUs == 1:
		return &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: strconv.Itoa(o.SingleCPU)}}
	case o.CPUs > 1:
		quota, period := int64(o.CPUs)*cpuPeriod, uint64(cpuPeriod)
		return &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}}
	}
	return nil
}

// shape is what a restore requires to match the capture, and what Fingerprint digests.
type shape struct {
	Args         []string                 `json:"args"`
	Cwd          string                   `json:"cwd"`
	User         specs.User               `json:"user"`
	Rlimits      []specs.POSIXRlimit      `json:"rlimits"`
	Capabilities *specs.LinuxCapabilities `json:"capabilities"`
	NoNewPrivs   bool                     `json:"no_new_privileges"`
	Mounts       []shapeMount             `json:"mounts"`
	RootReadonly bool                     `json:"root_readonly"`
	Namespaces   []specs.LinuxNamespace   `json:"namespaces"`
	Network      string                   `json:"network"`
	Overlay      string                   `json:"overlay"`
}

// shapeMount is a mount without its source, which a restore may change.
type shapeMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
}

// shapeOf takes the shape of s, which has a process and a root.
func shapeOf(s *specs.Spec, flags Flags) shape {
	sh := shape{
		Args: s.Process.Args, Cwd: s.Process.Cwd, User: s.Process.User, Rlimits: s.Process.Rlimits,
		Capabilities: s.Process.Capabilities, NoNewPrivs: s.Process.NoNewPrivileges,
		RootReadonly: s.Root.Readonly, Network: flags.Network, Overlay: flags.Overlay,
	}
	for _, m := range s.Mounts {
		sh.Mounts = append(sh.Mounts, shapeMount{m.Destination, m.Type, m.Options})
	}
	if s.Linux != nil {
		sh.Namespaces = s.Linux.Namespaces
	}
	return sh
}

// Fingerprint returns a digest ("sha256:" + hex) of what a restore requires to match the
// capture: args, cwd, user, rlimits, capabilities, mounts (without their sources), read-only
// root, and runsc's network and overlay. Environment and mount sources may differ, so they are
// left out.
func Fingerprint(s *specs.Spec, flags Flags) (string, error) {
	if s.Process == nil || s.Root == nil {
		return "", fmt.Errorf("%w: spec without process or root", ErrSpec)
	}
	data, err := json.Marshal(shapeOf(s, flags))
	if err != nil {
		return "", err
	}
	return filedigest.OfBytes(data), nil
}
