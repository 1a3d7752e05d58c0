// Package store is the content-addressed checkpoint store: the cache key of a checkpoint (a
// digest of everything that changes what is saved or what restore checks), and entries that
// hold one checkpoint per key, written atomically, verified before every reuse.
package store

import (
	"encoding/json"
	"fmt"
	"slices"

	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/sandbox"
)

// KeySchema is the version of the key's own encoding: bump it when KeyInputs changes meaning,
// so no key of the old encoding can match.
const KeySchema = 3

// EnvValue is a pass_env variable in a key: its name and the sha256 of its value ("unset" when
// the pipeline's environment lacks it), never the value itself.
type EnvValue struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// CPU is what restore checks of the host CPU (gVisor's pkg/cpuid CheckHostCompatible): the
// saved feature set must be part of the host's, and the CLFLUSH cache line size must match.
// The CPU model, stepping and cache sizes are not checked, so they are not here.
type CPU struct {
	// Features are the features the sandboxes are given, sorted, joined by commas: the build
	// host's, or the config's cpu_baseline (part of the build host's), so build hosts of
	// different CPU types with one baseline share keys.
	Features string `json:"features"`
	// CacheLine is the CLFLUSH line size in bytes (CPUID leaf 1, /proc/cpuinfo "clflush size").
	CacheLine int `json:"cache_line"`
	// Controls are a baseline's library controls, in the capture's environment and so in the
	// saved memory.
	Controls map[string]string `json:"controls,omitempty"`
}

// KeyInputs are the parts of a checkpoint's key. Each is there because changing it changes
// the saved image or makes restore refuse it.
type KeyInputs struct {
	Schema int `json:"schema"`
	// RunscSHA256: restore accepts only an image saved by the same runsc version, and the
	// binary decides what is saved.
	RunscSHA256 string `json:"runsc_sha256"`
	// RunscHelpers: the sentry runsc boots with is what saves the image (its helpers'
	// digests by name, manifest.Runsc.Helpers). Absent for a runsc without helpers, whose keys
	// it leaves as they were.
	RunscHelpers map[string]string `json:"runsc_helpers,omitempty"`
	// RunscFlags: the global flags shape the sandbox (network, overlay, host UDS) that is saved.
	RunscFlags []string `json:"runsc_flags"`
	// CheckpointOptions: the capture annotations change the image (compression, zero pages).
	CheckpointOptions map[string]string `json:"checkpoint_options"`
	// SpecFingerprint: restore requires the same spec shape.
	SpecFingerprint string `json:"spec_fingerprint"`
	// RootfsDigest: the files the interpreter loaded, the executor included.
	RootfsDigest string `json:"rootfs_digest"`
	// Imports, in order: import order can change what is in memory.
	Imports []string `json:"imports"`
	// ExecutorProtocol: a worker speaks to the restored executor with it.
	ExecutorProtocol int `json:"executor_protocol"`
	// PassEnv: the values are in the saved process's memory (os.environ).
	PassEnv []EnvValue `json:"pass_env"`
	// CPU: what restore checks of the host.
	CPU CPU `json:"cpu"`
	// CPUs: the CPU count the sandbox saw, which the restored kernel keeps and libraries
	// sized themselves by (OpenBLAS's threads, in the saved memory).
	CPUs int `json:"cpus"`
	// ImageConfig: the image config's environment, cwd and user, which the saved process was
	// started with (its os.environ, its sys.path through PYTHONPATH or a venv's PATH). Absent
	// for the default rootfs, whose keys it leaves as they were.
	ImageConfig *sandbox.Process `json:"image_config,omitempty"`
}

// PassEnvValues describes the pass_env variables for a key, sorted by name.
func PassEnvValues(names []string, lookup func(string) (string, bool)) []EnvValue {
	values := make([]EnvValue, 0, len(names))
	for _, name := range slices.Sorted(slices.Values(names)) {
		v := EnvValue{Name: name, SHA256: "unset"}
		if value, ok := lookup(name); ok {
			v.SHA256 = digest([]byte(value))
		}
		values = append(values, v)
	}
	return slices.CompactFunc(values, func(a, b EnvValue) bool { return a.Name == b.Name })
}

func digest(data []byte) string { return filedigest.OfBytes(data) }

// canonical returns the JSON encoding of v: struct fields in declaration order, map keys
// sorted, nil slices and maps as empty ones, so equal inputs always encode alike.
func canonical(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("store: encode key inputs: %v", err)) // plain data: cannot fail
	}
	return data
}

func (in KeyInputs) normalized() KeyInputs {
	if in.RunscFlags == nil {
		in.RunscFlags = []string{}
	}
	if in.CheckpointOptions == nil {
		in.CheckpointOptions = map[string]string{}
	}
	if in.Imports == nil {
		in.Imports = []string{}
	}
	if in.PassEnv == nil {
		in.PassEnv = []EnvValue{}
	}
	return in
}

// Key returns the checkpoint's cache key: "sha256:" and the digest of the canonical encoding.
func (in KeyInputs) Key() string { return digest(canonical(in.normalized())) }

// Parts digests each input alone, by its JSON name, so that two keys can say which of their
// inputs differ (Diff) without storing the inputs themselves.
func (in KeyInputs) Parts() map[string]string {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(canonical(in.normalized()), &fields); err != nil {
		panic(fmt.Sprintf("store: decode key inputs: %v", err))
	}
	parts := make(map[string]string, len(fields))
	for name, raw := range fields {
		parts[name] = digest(raw)
	}
	return parts
}

// Diff names the parts that differ between two keys' parts, sorted; a part only one side
// has counts as different.
func Diff(a, b map[string]string) []string {
	var names []string
	for name, v := range a {
		if b[name] != v {
			names = append(names, name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
