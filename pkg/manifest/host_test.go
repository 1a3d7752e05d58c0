package manifest

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/cpu"
)

func withCPU(c *CPU) *Manifest {
	m := sample()
	m.CPU, m.CPUs = c, 2
	m.Checkpoints = append(m.Checkpoints, Checkpoint{ID: "pandas", Imports: []string{"pandas"}, Dir: "pandas"})
	return m
}

func hostOf(m *Manifest) RestoreHost {
	return RestoreHost{RunscVersion: m.Runsc.Version, RunscSHA256: m.Runsc.SHA256, ExecutorProtocol: m.ExecutorProtocol,
		CPU: cpu.Host{Features: []string{"avx", "avx2", "fpu", "sse2"}, CacheLine: 64}, CPUs: m.CPUs}
}

func TestCheckHost(t *testing.T) {
	need := &CPU{Features: []string{"avx", "avx2", "fpu"}, CacheLine: 64}
	no := false
	helpers := map[string]string{"gvisor_sentry": "sha256:5e", "gvisor-sentry-prewarmer": "sha256:0f"}
	withHelpers := func(sentry, prewarmer string) func(*RestoreHost) {
		return func(h *RestoreHost) {
			h.RunscHelpers = map[string]string{}
			for name, digest := range map[string]string{"gvisor_sentry": sentry, "gvisor-sentry-prewarmer": prewarmer} {
				if digest != "" {
					h.RunscHelpers[name] = digest
				}
			}
		}
	}
	tests := []struct {
		name     string
		cpu      *CPU
		recorded map[string]string // the manifest's runsc.helpers
		change   func(*RestoreHost)
		restores bool
		problems []string
		warnings []string
	}{
		{"the same host", need, nil, func(*RestoreHost) {}, true, nil, nil},
		{"features lacking and a cache line", need, nil, func(h *RestoreHost) {
			h.CPU.Features = []string{"fpu", "sse2"}
			h.CPU.CacheLine = 128
		}, false, []string{"missing CPU features: avx, avx2", "cache line 128 bytes, the checkpoints need 64"}, nil},
		{"no cache line in the features file", need, nil, func(h *RestoreHost) { h.CPU.CacheLine = 0 }, true, nil,
			[]string{"cache line not checked: the host's features carry no \"clflush size\" line (the checkpoints need 64 bytes)"}},
		{"another runsc", need, nil, func(h *RestoreHost) { h.RunscVersion = "other" }, false, []string{`runsc version "other", the checkpoints were saved by "v"`}, nil},
		{"another runsc build", need, nil, func(h *RestoreHost) { h.RunscSHA256 = "sha256:99" }, false, []string{"runsc binary sha256:99, the checkpoints were saved by sha256:ab"}, nil},
		{"runsc sha256 unknown", need, nil, func(h *RestoreHost) { h.RunscSHA256 = "" }, true, nil, nil},
		{"another protocol", need, nil, func(h *RestoreHost) { h.ExecutorProtocol = 3 }, false, []string{"the artifacts speak executor protocol 2, this worker implements 3"}, nil},
		{"an output from before cpu", nil, nil, func(h *RestoreHost) { h.CPU.Features = nil }, true, nil, []string{"the manifest records no cpu"}},
		{"fewer CPUs than the sandboxes saw", need, nil, func(h *RestoreHost) { h.CPUs = 1 }, true, nil,
			[]string{"1 CPUs, the checkpoints' sandboxes see 2 (cpus)"}},
		{"more CPUs than the sandboxes saw", need, nil, func(h *RestoreHost) { h.CPUs = 64 }, true, nil, nil},
		{"a host whose CPU count is unknown", need, nil, func(h *RestoreHost) { h.CPUs = 0 }, true, nil, []string{"CPU count not checked"}},
		{"an unenforced baseline", &CPU{Features: need.Features, CacheLine: 64, Baseline: need.Features, Enforced: &no, Controls: map[string]string{"NPY_DISABLE_CPU_FEATURES": "AVX512F"}},
			nil, func(*RestoreHost) {}, true, nil, []string{"the CPU baseline is not enforced"}},
		{"the same helpers", need, helpers, withHelpers("sha256:5e", "sha256:0f"), true, nil, nil},
		{"another sentry", need, helpers, withHelpers("sha256:77", "sha256:0f"), false,
			[]string{"runsc's helper gvisor_sentry sha256:77, the checkpoints were saved by sha256:5e: another build"}, nil},
		{"another prewarmer", need, helpers, withHelpers("sha256:5e", "sha256:77"), true, nil,
			[]string{"runsc's helper gvisor-sentry-prewarmer sha256:77, the checkpoints were saved with sha256:0f"}},
		{"no helpers on the host", need, helpers, withHelpers("", ""), true, nil,
			[]string{"runsc's helper gvisor-sentry-prewarmer is missing on this host", "runsc's helper gvisor_sentry is missing on this host"}},
		{"the host's helpers unknown", need, helpers, func(*RestoreHost) {}, true, nil, nil},
		{"an output from before helpers", need, nil, withHelpers("sha256:5e", "sha256:0f"), true, nil, nil},
		{"another runsc build and another sentry: the binary said", need, helpers, func(h *RestoreHost) {
			withHelpers("sha256:77", "sha256:0f")(h)
			h.RunscSHA256 = "sha256:99"
		}, false, []string{"runsc binary sha256:99"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := withCPU(tt.cpu)
			m.Runsc.Helpers = tt.recorded
			h := hostOf(m)
			tt.change(&h)
			r := CheckHost(m, h)
			if r.Restores != tt.restores || len(r.Checkpoints) != 2 {
				t.Fatalf("%+v", r)
			}
			for _, v := range r.Checkpoints {
				if v.Restores != tt.restores || len(v.Problems) != len(tt.problems) || len(v.Warnings) != len(tt.warnings) {
					t.Fatalf("%s: %+v", v.ID, v)
				}
				for i, want := range tt.problems {
					if !strings.Contains(v.Problems[i], want) {
						t.Errorf("%s: problem %q, want %q", v.ID, v.Problems[i], want)
					}
				}
				for i, want := range tt.warnings {
					if !strings.Contains(v.Warnings[i], want) {
						t.Errorf("%s: warning %q, want %q", v.ID, v.Warnings[i], want)
					}
				}
			}
		})
	}
}

// TestCPURoundTrip: cpu and cpu_check survive manifest.json; a manifest without them (an
// older output) loads with CPU nil.
func TestCPURoundTrip(t *testing.T) {
	no := false
	m := withCPU(&CPU{Features: []string{"fpu"}, CacheLine: 64, Baseline: []string{"fpu"}, Enforced: &no, Controls: map[string]string{"A": "b"}})
	m.Checkpoints[0].CPUCheck = &CPUCheck{Verdict: CPULibraries, Outside: map[string][]string{"cpuid": {"avx512f"}}, Checked: map[string]string{"numpy": "1.24.2"}}
	path := filepath.Join(t.TempDir(), FileName)
	if err := atomicfile.WriteJSON(path, m); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got.CPU.Unenforced() || got.CPU.CacheLine != 64 || got.Checkpoints[0].CPUCheck.Outside["cpuid"][0] != "avx512f" || got.Checkpoints[1].CPUCheck != nil {
		t.Errorf("%+v %+v", got.CPU, got.Checkpoints)
	}
	old := sample()
	data, _ := json.Marshal(old)
	if strings.Contains(string(data), `"cpu"`) {
		t.Errorf("a manifest without cpu writes one: %s", data)
	}
	atomicfile.Write(path, data, 0o644)
	if got, err := Load(path); err != nil || got.CPU != nil || got.CPU.Unenforced() {
		t.Errorf("an older manifest: %v %+v", err, got)
	}
	yes := true
	if (&CPU{Enforced: &yes}).Unenforced() || (&CPU{}).Unenforced() {
		t.Error("Unenforced without an unenforced baseline")
	}
}
