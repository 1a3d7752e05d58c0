package sandbox

import (
	"errors"
	"fmt"
	"math"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/bytesize"
)

// Limits bound one sandbox on the host: the runtime spec's linux.resources, which runsc
// applies through the cgroups it makes for the sandbox (memory, pids, cpu; cgroup v1 or v2).
// They are the caller's (a worker's flags, the pipeline's config), applied to the spec of each
// sandbox it makes (Apply), never read from an output: ReadSpec refuses a restore spec with
// resources. The zero Limits bounds nothing.
type Limits struct {
	// Memory bounds the sandbox's memory in bytes: the sentry, the gofer and the application's
	// pages, charged to the sandbox's cgroup. Past it the kernel's OOM killer ends the
	// sandbox, not one of its processes. 0: none.
	Memory bytesize.Size
	// Pids bounds the sandbox's tasks on the host: the sentry's and gofer's threads (about 20
	// for an idle executor) and, under systrap, a stub process per address space of the
	// application, with its threads. A fork or thread past it ends the sandbox: the sentry
	// cannot make the stub it needs and stops. 0: none.
	Pids int64
	// CPUs bounds the sandbox's CPU time, in CPUs (1.5: one and a half CPUs' time in every
	// period of 100 ms; cpu.cfs_quota_us or cpu.max). 0: none.
	CPUs float64
}

// Floors under which no executor runs at all: a limit below them is refused (Check) rather
// than left to fail as a sandbox that never answers.
const (
	MinMemory bytesize.Size = 32 << 20
	MinPids   int64         = 32
	MinCPUs                 = 0.01
)

// cpuPeriod is the CFS period of a CPU quota, in microseconds (the kernel's default, 100 ms):
// the CPU limit and a capture's pinned count are shares of it.
const cpuPeriod = 100_000

// ErrLimits reports limits that cannot bound a sandbox.
var ErrLimits = errors.New("sandbox limits refused")

// IsZero reports whether l bounds nothing.
func (l Limits) IsZero() bool { return l == Limits{} }

// Check refuses a negative limit, and one below the floor of a sandbox that runs the executor
// (MinMemory, MinPids, MinCPUs), naming each.
func (l Limits) Check() error {
	var problems []string
	if l.Memory != 0 && l.Memory < MinMemory {
		problems = append(problems, fmt.Sprintf("memory %s: want 0 (none) or at least %s", l.Memory, MinMemory))
	}
	if l.Pids != 0 && l.Pids < MinPids {
		problems = append(problems, fmt.Sprintf("pids %d: want 0 (none) or at least %d (a sandbox's own threads)", l.Pids, MinPids))
	}
	if math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs != 0 && l.CPUs < MinCPUs || l.CPUs > 1<<20 {
		problems = append(problems, fmt.Sprintf("cpus %g: want 0 (none) or %g to %d", l.CPUs, MinCPUs, 1<<20))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrLimits, strings.Join(problems, "; "))
	}
	return nil
}

// Apply sets spec's linux.resources to l (nothing for the zero Limits) and its cgroups path
// to cgroupsPath, where runsc makes the sandbox's cgroups and where Events reads what they
// refused. l must have passed Check.
func (l Limits) Apply(spec *specs.Spec, cgroupsPath string) {
	if l.IsZero() {
		return
	}
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	// Merged into what the spec holds: a capture's spec pins its CPU count (SpecOptions.CPUs).
	r := spec.Linux.Resources
	if r == nil {
		r = &specs.LinuxResources{}
	}
	if l.Memory > 0 {
		memory := int64(l.Memory)
		// No swap limit: memory.memsw exists only where the kernel accounts swap, and runsc's
		// create fails on a file that is not there.
		r.Memory = &specs.LinuxMemory{Limit: &memory}
	}
	if l.Pids > 0 {
		pids := l.Pids
		r.Pids = &specs.LinuxPids{Limit: &pids}
	}
	// A capture's pinned CPU count (a quota of that many CPUs, or a cpuset of one) already
	// bounds its CPU time and is kept: a lower quota would make runsc give the sandbox fewer
	// CPUs than its checkpoint is captured for.
	if l.CPUs > 0 && r.CPU == nil {
		quota, period := int64(math.Round(l.CPUs*cpuPeriod)), uint64(cpuPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	spec.Linux.Resources = r
	spec.Linux.CgroupsPath = cgroupsPath
}

// String names the limits set, as a worker's flags write them: "memory 512MiB, pids 256,
// cpus 1.5"; "none" for the zero Limits.
func (l Limits) String() string {
	var parts []string
	if l.Memory > 0 {
		parts = append(parts, "memory "+l.Memory.String())
	}
	if l.Pids > 0 {
		parts = append(parts, fmt.Sprintf("pids %d", l.Pids))
	}
	if l.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("cpus %g", l.CPUs))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
