package sandbox

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestLimitsCheck: a negative limit, or one below a sandbox's floor, is refused by name; zero
// (none) and sound limits pass.
func TestLimitsCheck(t *testing.T) {
	for _, l := range []Limits{{}, {Memory: MinMemory}, {Memory: 512 << 20, Pids: 256, CPUs: 1.5}, {CPUs: 0.01}} {
		if err := l.Check(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{Memory: -1}, "memory -1"},
		{Limits{Memory: 1 << 20}, "memory 1MiB"},
		{Limits{Pids: -5}, "pids -5"},
		{Limits{Pids: 8}, "pids 8"},
		{Limits{CPUs: -1}, "cpus -1"},
		{Limits{CPUs: math.NaN()}, "cpus NaN"},
		{Limits{CPUs: math.Inf(1)}, "cpus +Inf"},
	} {
		err := tc.l.Check()
		if !errors.Is(err, ErrLimits) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want ErrLimits naming %q", tc.l, err, tc.want)
		}
	}
}

// TestLimitsApply: the limits become the spec's linux.resources and its cgroups path, as
// runsc reads them; the zero Limits leaves the spec as it is.
func TestLimitsApply(t *testing.T) {
	spec := &specs.Spec{}
	Limits{}.Apply(spec, "/id")
	if spec.Linux != nil {
		t.Errorf("the zero Limits changed the spec: %+v", spec.Linux)
	}
	Limits{Memory: 100 << 20, Pids: 64, CPUs: 1.5}.Apply(spec, "/id")
	data, _ := json.Marshal(spec.Linux)
	want := `{"resources":{"memory":{"limit":104857600},"cpu":{"quota":150000,"period":100000},"pids":{"limit":64}},"cgroupsPath":"/id"}`
	if string(data) != want {
		t.Errorf("linux = %s\nwant    %s", data, want)
	}

	// A capture's spec pins its CPU count: the limits add memory and pids, and keep the pin.
	for _, cpus := range []int{1, 4} {
		o := testOptions(ModeCapture)
		o.CPUs = cpus
		pinned := mustSpec(t, o)
		before, _ := json.Marshal(pinned.Linux.Resources.CPU)
		Limits{Memory: 100 << 20, Pids: 64, CPUs: 1.5}.Apply(pinned, "/id")
		after, _ := json.Marshal(pinned.Linux.Resources.CPU)
		if r := pinned.Linux.Resources; string(after) != string(before) || r.Memory == nil || r.Pids == nil {
			t.Errorf("%d CPUs pinned: cpu %s (was %s), memory %v, pids %v", cpus, after, before, r.Memory, r.Pids)
		}
	}
}

func TestLimitsString(t *testing.T) {
	for l, want := range map[Limits]string{{}: "none", {Memory: 512 << 20, Pids: 256, CPUs: 1.5}: "memory 512MiB, pids 256, cpus 1.5", {Pids: 64}: "pids 64"} {
		if got := l.String(); got != want {
			t.Errorf("%+v: %q, want %q", l, got, want)
		}
	}
}
