package cpubaseline

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/manifest"
)

// ErrBaseline reports a checkpoint that does not stay within the config's CPU baseline, or
// whose capture could not show that it does.
var ErrBaseline = errors.New("CPU baseline not held")

// ErrUnenforceable marks a refusal that holds for every capture on this host: the CPUID
// instruction shows features outside the baseline, whatever a set imports.
var ErrUnenforceable = errors.New("this host cannot enforce the CPU baseline")

// BuildHost is what the judgement needs to know of the build host.
type BuildHost struct {
	// CPUIDFaulting: the host lets gVisor trap the CPUID instruction (cpuid_fault).
	CPUIDFaulting bool
}

// libraries are the places of the check whose choices the checkpoint holds.
var libraries = []string{"cpuinfo", "numpy", "glibc", "openblas", "openssl"}

// Judge decides whether a checkpoint whose capture saw check may be used: an enforced baseline
// always; one that only the library controls keep (verdict libraries) only when the config
// accepts an unenforced baseline (enforce false); never one that a library left. The error
// names the features and says why.
func Judge(check *manifest.CPUCheck, enforce bool, h BuildHost) error {
	if check == nil {
		return fmt.Errorf("%w: the executor reported no CPU check (a checkpoint captured without the baseline?)", ErrBaseline)
	}
	switch check.Verdict {
	case manifest.CPUEnforced:
		return nil
	case manifest.CPULibraries:
		if !enforce {
			return nil
		}
		return fmt.Errorf("%w: %w: the sandbox cannot hide features outside cpu_baseline from code that runs the CPUID instruction itself: %s; %s. "+
			"numpy, glibc, OpenSSL and OpenBLAS stayed within the baseline (the library controls); to accept that, set cpu_baseline's enforce: false",
			ErrBaseline, ErrUnenforceable, seenThroughCPUID(check), whyNotHidden(check, h))
	case manifest.CPUViolated:
		var parts []string
		for _, name := range libraries {
			if seen := check.Outside[name]; len(seen) > 0 {
				parts = append(parts, name+": "+strings.Join(seen, ", "))
			}
		}
		return fmt.Errorf("%w: code in the sandbox chose features outside cpu_baseline (%s)%s", ErrBaseline, strings.Join(parts, "; "), checkErrors(check))
	case "error":
		return fmt.Errorf("%w: the CPU check in the sandbox failed: %s", ErrBaseline, check.Checked["error"])
	}
	return fmt.Errorf("%w: the CPU check in the sandbox gave verdict %q", ErrBaseline, check.Verdict)
}

func seenThroughCPUID(check *manifest.CPUCheck) string {
	var parts []string
	if seen := check.Outside["cpuid"]; len(seen) > 0 {
		parts = append(parts, "it sees "+strings.Join(seen, ", "))
	}
	if seen := check.Outside["cpuid_unnamed"]; len(seen) > 0 {
		parts = append(parts, "and "+strings.Join(seen, ", ")+", which gVisor has no names for")
	}
	if len(parts) == 0 {
		return "it could not be checked" + checkErrors(check)
	}
	return strings.Join(parts, " ")
}

func whyNotHidden(check *manifest.CPUCheck, h BuildHost) string {
	switch {
	case len(check.Outside["cpuid"]) > 0 && !h.CPUIDFaulting:
		return "this host has no CPUID faulting (no cpuid_fault in /proc/cpuinfo), so gVisor cannot trap the instruction; a host with it would enforce the baseline"
	case len(check.Outside["cpuid"]) > 0:
		return "the host reports CPUID faulting, yet the instruction was not trapped (is runsc's platform one that traps it?)"
	default:
		return "gVisor copies those bits from the host and cannot mask them, and restore cannot check them; no baseline that keeps avx512f can be enforced"
	}
}

func checkErrors(check *manifest.CPUCheck) string {
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(check.Checked)) {
		if v := check.Checked[k]; strings.HasPrefix(v, "error") {
			errs = append(errs, k+": "+v)
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return " (" + strings.Join(errs, "; ") + ")"
}
