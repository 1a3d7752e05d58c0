package manifest

// CPU is what the checkpoints of an output need of a host's CPU, and how the capture kept the
// sandboxes to it. gVisor's restore refuses a host that lacks one of Features or whose cache
// line differs; CheckHost says so before a restore is tried.
type CPU struct {
	// Features are the CPU features the sandboxes were given, as `runsc cpu-features` names
	// them, sorted: the build host's, or the config's cpu_baseline (which must be part of the
	// build host's).
	Features []string `json:"features"`
	// CacheLine is the CLFLUSH line size in bytes, which restore requires to be equal.
	CacheLine int `json:"cache_line"`
	// Baseline is the config's cpu_baseline; absent without one (then Features are simply the
	// build host's and there is nothing to enforce).
	Baseline []string `json:"baseline,omitempty"`
	// Enforced is set only with a baseline: true when the capture saw, from inside every
	// sandbox, nothing beyond the baseline, the CPUID instruction included (the build host
	// has CPUID faulting); false when the config accepted an unenforced baseline and only the
	// known libraries (numpy, glibc, OpenSSL, OpenBLAS) were kept within it by Controls.
	Enforced *bool `json:"enforced,omitempty"`
	// Controls are the environment variables that keep those libraries within the baseline.
	// The captures ran with them; a worker puts them into the restore environment too, for
	// libraries a request loads after the restore.
	Controls map[string]string `json:"controls,omitempty"`
}

// Unenforced reports whether c records a baseline that the capture could not enforce.
func (c *CPU) Unenforced() bool { return c != nil && c.Enforced != nil && !*c.Enforced }

// Verdicts of the CPU check made inside a capture's sandbox.
const (
	// CPUEnforced: nothing in the sandbox saw a feature outside the baseline, not even the
	// CPUID instruction run directly (the host lets gVisor trap it).
	CPUEnforced = "enforced"
	// CPULibraries: numpy, glibc, OpenSSL, OpenBLAS and /proc/cpuinfo stayed within the
	// baseline, but the CPUID instruction shows the host's features to any other code.
	CPULibraries = "libraries"
	// CPUViolated: a library the check knows chose code beyond the baseline.
	CPUViolated = "violated"
)

// CPUCheck is what the executor saw of the CPU from inside a capture's sandbox, after its
// imports and just before the checkpoint: what the checkpoint holds.
type CPUCheck struct {
	// Verdict is CPUEnforced, CPULibraries or CPUViolated.
	Verdict string `json:"verdict"`
	// Outside names, per place looked at, the features seen beyond the baseline: "cpuid"
	// (the instruction run directly), "cpuid_unnamed" (bits gVisor has no name for),
	// "cpuinfo", "numpy" (dispatch targets), "glibc", "openssl", "openblas", and
	// "glibc_active_not_dispatching" (bits glibc reports but no routine of it uses).
	Outside map[string][]string `json:"outside,omitempty"`
	// Checked names what was looked at, with its version or state: "numpy": "1.24.2", ...
	Checked map[string]string `json:"checked,omitempty"`
}
