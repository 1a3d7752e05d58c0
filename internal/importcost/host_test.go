package importcost

import (
	"testing"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/pkg/catalogue"
)

// The memory line is the least-squares line of the sets' own memory against their image sizes,
// in bytes and bytes per MiB, with its fit.
func TestMemoryLineFit(t *testing.T) {
	const mib = 1 << 20
	// 40 MiB of the sandbox's own, and 1.25 bytes of it per byte of image.
	line := memoryLine{MiB: []float64{8, 20, 40}, OwnBytes: []int64{50 * mib, 65 * mib, 90 * mib}}
	var h analysis.HostCosts
	line.fit(&h)
	want := catalogue.MemoryLine{InterceptBytes: 40 * mib, BytesPerMiB: 1.25 * mib}
	if h.Memory != want || h.MemoryRSquared != 1 {
		t.Errorf("fit %+v (R² %v), want %+v (R² 1)", h.Memory, h.MemoryRSquared, want)
	}
	if got := h.Memory.OwnBytes(30); got != 40*mib+37.5*mib {
		t.Errorf("predicted own memory of a 30 MiB image: %d bytes, want %d", got, int64(77.5*mib))
	}
	// A line that would slope down, or cross zero, is clamped as the time lines are.
	down := memoryLine{MiB: []float64{8, 40}, OwnBytes: []int64{90 * mib, 50 * mib}}
	h = analysis.HostCosts{}
	down.fit(&h)
	if h.Memory.BytesPerMiB != 0 || h.Memory.InterceptBytes <= 0 {
		t.Errorf("a line sloping down: %+v", h.Memory)
	}
}

// A memory line without a positive memory per image is never served from the cache: it is
// measured again, and a measurement of it is refused.
func TestMemoryLineRefusesNoMemory(t *testing.T) {
	c := &cache{dir: t.TempDir()}
	k := testKey().of("memory-line")
	for name, bad := range map[string]memoryLine{
		"a zero":      {MiB: []float64{8, 40}, OwnBytes: []int64{50 << 20, 0}},
		"none":        {},
		"one missing": {MiB: []float64{8, 40}, OwnBytes: []int64{50 << 20}},
	} {
		if bad.check() == nil {
			t.Errorf("%s: checked", name)
		}
		if err := c.put(k, bad); err != nil {
			t.Fatal(err)
		}
		var v memoryLine
		if ok, err := c.get(k, &v); ok || err != nil {
			t.Errorf("%s: taken from the cache (%v, %v): %+v", name, ok, err, v)
		}
	}
	good := memoryLine{MiB: []float64{8, 40}, OwnBytes: []int64{50 << 20, 90 << 20}}
	if err := c.put(k, good); err != nil {
		t.Fatal(err)
	}
	var v memoryLine
	if ok, err := c.get(k, &v); !ok || err != nil || len(v.OwnBytes) != 2 || v.OwnBytes[1] != 90<<20 {
		t.Errorf("a valid entry: %v, %v, %+v", ok, err, v)
	}
}
