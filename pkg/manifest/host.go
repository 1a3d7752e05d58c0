package manifest

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/runsc"
)

// RestoreHost is what a host that would restore a checkpoint offers it: its runsc, the executor
// protocol the worker speaks, and its CPU as restore sees it.
type RestoreHost struct {
	// RunscVersion is the version string of the host's runsc (`runsc --version`).
	RunscVersion string `json:"runsc_version"`
	// RunscSHA256 is the digest of the host's runsc binary; "" when unknown (not compared).
	RunscSHA256 string `json:"runsc_sha256,omitempty"`
	// RunscHelpers are the digests of the helpers the host's runsc would boot with, by name
	// (runsc.Runsc.Helpers); nil when unknown (not compared).
	RunscHelpers map[string]string `json:"runsc_helpers,omitempty"`
	// ExecutorProtocol is the executor protocol the worker implements.
	ExecutorProtocol int `json:"executor_protocol"`
	// CPU is the host's CPU; a CacheLine of 0 is unknown (not compared).
	CPU cpu.Host `json:"cpu"`
	// CPUs is how many CPUs the worker may run on; 0 is unknown (not compared).
	CPUs int `json:"cpus,omitempty"`
}

// ReadHost describes this host as r would restore on it: the runsc binary r runs (its
// version, its sha256, the helpers it boots with, by its own rule: r.HelpersDir, else
// $GVISOR_SIDECAR_BINARIES_DIR, else gvisor-bin/ beside it; and its `runsc cpu-features`, each
// command bounded by r's CommandTimeout), the cache line from /proc/cpuinfo, the CPUs this
// process may run on, and the executor protocol of pkg/executorproto.
func ReadHost(ctx context.Context, r *runsc.Runsc) (RestoreHost, error) {
	version, err := r.Version(ctx)
	if err != nil {
		return RestoreHost{}, err
	}
	_, binary, err := filedigest.Of(r.Path)
	if err != nil {
		return RestoreHost{}, err
	}
	helpers, err := r.Helpers()
	if err != nil {
		return RestoreHost{}, err
	}
	limit := r.CommandTimeout
	if limit <= 0 {
		limit = runsc.DefaultCommandTimeout
	}
	c, err := cpu.ReadHost(ctx, r.Path, limit)
	if err != nil {
		return RestoreHost{}, err
	}
	return RestoreHost{RunscVersion: version, RunscSHA256: binary, RunscHelpers: helpers, ExecutorProtocol: executorproto.Version, CPU: c, CPUs: runtime.NumCPU()}, nil
}

// Verdict says whether one checkpoint restores on a host, and why not.
type Verdict struct {
	ID       string `json:"id"`
	Restores bool   `json:"restores"`
	// Problems are the reasons it does not restore there, each naming what differs.
	Problems []string `json:"problems,omitempty"`
	// Warnings are what could not be checked, or holds only in part.
	Warnings []string `json:"warnings,omitempty"`
}

// Report is CheckHost's answer: a verdict per checkpoint.
type Report struct {
	// Restores is true when every checkpoint restores on the host.
	Restores    bool      `json:"restores"`
	Checkpoints []Verdict `json:"checkpoints"`
}

// CheckHost compares what the checkpoints of m need with what host h offers, as runsc's
// restore will: the runsc version string (exact; and the binary's sha256 when both are known,
// and its helpers' when the host's are known: compareHelpers), the executor protocol, the CPU
// features (the checkpoints' must be part of the host's) and the cache line (equal). It names
// every missing feature and differing value. A host with fewer CPUs than the checkpoints'
// sandboxes saw is a warning: they restore, with the count they were captured with, and
// whatever sized itself by it (a thread per CPU) shares fewer.
func CheckHost(m *Manifest, h RestoreHost) Report {
	var problems, warnings []string
	if err := m.CheckProtocol(h.ExecutorProtocol); err != nil {
		problems = append(problems, err.Error())
	}
	if h.RunscVersion != m.Runsc.Version {
		problems = append(problems, fmt.Sprintf("runsc version %q, the checkpoints were saved by %q (restore requires the same version string)", h.RunscVersion, m.Runsc.Version))
	} else if h.RunscSHA256 != "" && m.Runsc.SHA256 != "" && h.RunscSHA256 != m.Runsc.SHA256 {
		problems = append(problems, fmt.Sprintf("runsc binary %s, the checkpoints were saved by %s: another build under the same version string", h.RunscSHA256, m.Runsc.SHA256))
	} else if h.RunscHelpers != nil {
		p, w := compareHelpers(m.Runsc.Helpers, h.RunscHelpers)
		problems, warnings = append(problems, p...), append(warnings, w...)
	}
	switch c := m.CPU; {
	case c == nil:
		warnings = append(warnings, "the manifest records no cpu (made before the pipeline recorded it): the CPU is checked only by runsc restore")
	default:
		if missing := cpu.Missing(c.Features, h.CPU.Features); len(missing) > 0 {
			problems = append(problems, "missing CPU features: "+strings.Join(missing, ", "))
		}
		switch {
		case h.CPU.CacheLine == 0:
			warnings = append(warnings, fmt.Sprintf("cache line not checked: the host's features carry no %q line (the checkpoints need %d bytes)", "clflush size", c.CacheLine))
		case h.CPU.CacheLine != c.CacheLine:
			problems = append(problems, fmt.Sprintf("cache line %d bytes, the checkpoints need %d (restore requires them equal)", h.CPU.CacheLine, c.CacheLine))
		}
	}
	switch {
	case m.CPUs == 0:
	case h.CPUs == 0:
		warnings = append(warnings, fmt.Sprintf("CPU count not checked: the host's is unknown (the checkpoints' sandboxes see %d)", m.CPUs))
	case h.CPUs < m.CPUs:
		warnings = append(warnings, fmt.Sprintf("%d CPUs, the checkpoints' sandboxes see %d (cpus): they restore with %d, and what sized itself by the count at capture (OpenBLAS: a thread per CPU) shares %d", h.CPUs, m.CPUs, m.CPUs, h.CPUs))
	}
	r := Report{Restores: len(problems) == 0, Checkpoints: []Verdict{}}
	for _, c := range m.Checkpoints {
		v := Verdict{ID: c.ID, Restores: len(problems) == 0, Problems: problems, Warnings: warnings}
		if m.CPU.Unenforced() {
			v.Warnings = append(slices.Clone(warnings), unenforced(c.CPUCheck))
		}
		r.Checkpoints = append(r.Checkpoints, v)
	}
	return r
}

// compareHelpers compares the helpers the checkpoints were saved with (recorded) with the
// host's, each recorded one alone. The sentry is what saves and restores a sandbox, so another
// build of it under the same version string is a problem, as another runsc binary is; the
// prewarmer only readies the sentry's process, so another one is a warning. A helper the host
// lacks is a warning: runsc boots without it (with itself as the sentry), slower, and gVisor
// deprecates that.
func compareHelpers(recorded, host map[string]string) (problems, warnings []string) {
	for _, name := range slices.Sorted(maps.Keys(recorded)) {
		want, have := recorded[name], host[name]
		switch {
		case have == "":
			warnings = append(warnings, fmt.Sprintf("runsc's helper %s is missing on this host (the checkpoints were saved with %s): runsc boots without it, which gVisor deprecates", name, want))
		case have == want:
		case name == runsc.Sentry:
			problems = append(problems, fmt.Sprintf("runsc's helper %s %s, the checkpoints were saved by %s: another build under the same version string", name, have, want))
		default:
			warnings = append(warnings, fmt.Sprintf("runsc's helper %s %s, the checkpoints were saved with %s", name, have, want))
		}
	}
	return problems, warnings
}

// unenforced returns the warning for a checkpoint of an unenforced CPU baseline.
func unenforced(check *CPUCheck) string {
	saw := ""
	if check != nil {
		if seen := slices.Concat(check.Outside["cpuid"], check.Outside["cpuid_unnamed"]); len(seen) > 0 {
			saw = " (at capture, the CPUID instruction showed " + strings.Join(seen, ", ") + ")"
		}
	}
	return "the CPU baseline is not enforced (cpu.enforced false): only numpy, glibc, OpenSSL and OpenBLAS were verified to stay within it; other code that runs CPUID itself may have chosen instructions beyond it" +
		saw + "; put cpu.controls into the restore environment"
}
