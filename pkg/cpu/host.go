package cpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Host is what restore checks of a host's CPU (gVisor's CheckHostCompatible): the saved
// feature set must be part of the host's, and the CLFLUSH cache line size must be equal.
type Host struct {
	// Features are gVisor's names for the host's features, sorted.
	Features []string `json:"features"`
	// CacheLine is the CLFLUSH line size in bytes; 0 when unknown (a features file that
	// carries only `runsc cpu-features`).
	CacheLine int `json:"cache_line,omitempty"`
}

// String returns h in the features file format (ParseHosts).
func (h Host) String() string {
	s := strings.Join(h.Features, ",") + "\n"
	if h.CacheLine != 0 {
		s += fmt.Sprintf("clflush size\t: %d\n", h.CacheLine)
	}
	return s
}

// ErrFormat reports a features file that is not in the format ParseHosts reads.
var ErrFormat = errors.New("not a CPU features file")

// cacheLineKey starts the line that /proc/cpuinfo writes the CLFLUSH line size on.
const cacheLineKey = "clflush size"

// ParseHosts reads a features file: one host type per line as `runsc cpu-features` prints it
// (gVisor's names, separated by commas), each optionally followed by its cache line as
// /proc/cpuinfo writes it (`clflush size : 64`); blank lines and lines starting with # are
// ignored. `{ runsc cpu-features; grep -m1 'clflush size' /proc/cpuinfo; }` writes one host.
// Names gVisor does not know are an error that names them and their line. name is the file's
// name for errors.
func ParseHosts(r io.Reader, name string) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		switch {
		case text == "" || strings.HasPrefix(text, "#"):
			continue
		case strings.HasPrefix(text, cacheLineKey):
			n, err := parseCacheLine(text)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: line %d: %w", ErrFormat, name, line, err)
			}
			if len(hosts) == 0 || hosts[len(hosts)-1].CacheLine != 0 {
				return nil, fmt.Errorf("%w: %s: line %d: a %q line belongs after the features line of its host, once", ErrFormat, name, line, cacheLineKey)
			}
			hosts[len(hosts)-1].CacheLine = n
		default:
			features, err := parseFeatures(text)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: line %d: %w", ErrFormat, name, line, err)
			}
			hosts = append(hosts, Host{Features: features})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: %s holds no features line (write one with `runsc cpu-features`)", ErrFormat, name)
	}
	return hosts, nil
}

// ReadHosts reads the features file at path (ParseHosts).
func ReadHosts(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseHosts(f, path)
}

func parseFeatures(text string) ([]string, error) {
	var features []string
	for _, f := range strings.Split(text, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			return nil, errors.New("an empty feature name (want names separated by single commas)")
		case strings.ContainsAny(f, " \t:"):
			return nil, fmt.Errorf("%q is not a feature name: want gVisor's names separated by commas, as `runsc cpu-features` prints them", f)
		}
		features = append(features, f)
	}
	if bad := Unknown(features); len(bad) > 0 {
		return nil, fmt.Errorf("names gVisor does not know: %s (runsc cpu-features prints the names it knows; they are case-sensitive)", strings.Join(bad, ", "))
	}
	return Normalize(features), nil
}

func parseCacheLine(text string) (int, error) {
	_, value, ok := strings.Cut(text, ":")
	n, err := strconv.Atoi(strings.TrimSpace(value))
	if !ok || err != nil || n <= 0 || n > 1<<16 {
		return 0, fmt.Errorf("%q: want %q, a colon and a size in bytes, as /proc/cpuinfo writes it", text, cacheLineKey)
	}
	return n, nil
}

// CPUInfo is where Linux describes this host's CPUs.
const CPUInfo = "/proc/cpuinfo"

// ReadHost reads this host's CPU as restore sees it: `runsc cpu-features` of the runsc binary
// at runsc, bounded by limit, and the cache line from /proc/cpuinfo.
func ReadHost(ctx context.Context, runsc string, limit time.Duration) (Host, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("%s cpu-features exceeded its timeout of %s", runsc, limit))
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "cpu-features")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second // a child that keeps stdout open must not hold us past the limit
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return Host{}, fmt.Errorf("%w: %w", context.Cause(ctx), ctx.Err())
	}
	if err != nil {
		return Host{}, fmt.Errorf("%s cpu-features: %w: %s", runsc, err, strings.TrimSpace(stderr.String()))
	}
	hosts, err := ParseHosts(bytes.NewReader(out), runsc+" cpu-features")
	if err != nil {
		return Host{}, err
	}
	if len(hosts) != 1 || hosts[0].CacheLine != 0 {
		return Host{}, fmt.Errorf("%w: %s cpu-features printed %d hosts, want one line", ErrFormat, runsc, len(hosts))
	}
	line, err := ReadCacheLine(CPUInfo)
	if err != nil {
		return Host{}, err
	}
	return Host{Features: hosts[0].Features, CacheLine: line}, nil
}

// ReadCacheLine reads the first "clflush size" of a /proc/cpuinfo: the CLFLUSH line size
// (CPUID.1:EBX[15:8] x 8), which restore requires to be equal.
func ReadCacheLine(path string) (int, error) {
	value, err := cpuinfoField(path, cacheLineKey)
	if err != nil {
		return 0, err
	}
	n, err := parseCacheLine(cacheLineKey + ":" + value)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// CPUIDFaulting reports whether the CPU and kernel of this host let a process make the CPUID
// instruction fault (`cpuid_fault` in the flags of /proc/cpuinfo). Only then can gVisor's
// systrap and ptrace platforms answer CPUID from the sandbox's feature set; without it, code
// that runs CPUID itself sees the host's features whatever the sandbox was given.
func CPUIDFaulting(path string) (bool, error) {
	flags, err := cpuinfoField(path, "flags")
	if err != nil {
		return false, err
	}
	for _, f := range strings.Fields(flags) {
		if f == "cpuid_fault" {
			return true, nil
		}
	}
	return false, nil
}

// cpuinfoField returns the value of the first line of a /proc/cpuinfo whose key is key.
func cpuinfoField(path, key string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // the flags line is long
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return "", fmt.Errorf("%s has no %q line", path, key)
}
