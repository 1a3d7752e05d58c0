package run

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// singleCPU returns the lowest CPU this process may run on: the one a capture's sandbox of one
// CPU is confined to (a cpuset must name CPUs the caller's cgroup has). 0 when the affinity
// cannot be read; the capture then checks what its sandbox saw.
func singleCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	for cpu := range len(set) * 64 {
		if set.IsSet(cpu) {
			return cpu
		}
	}
	return 0
}

// checkHostCPUs refuses a build host that cannot give a capture's sandbox want CPUs: runsc
// counts the CPUs of the sandbox's cpuset, which a quota only lowers.
func checkHostCPUs(want int) error {
	if have := runtime.NumCPU(); have < want {
		return fmt.Errorf("%w: sandbox.cpus is %d, this host gives the pipeline %d CPUs: a capture's sandbox sees at most the host's (its checkpoint keeps the count), so set sandbox.cpus to %d or fewer everywhere, or build on a host with %d", ErrSetup, want, have, have, want)
	}
	return nil
}
