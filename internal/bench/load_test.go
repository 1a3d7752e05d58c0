package bench

import (
	"context"
	"math"
	"strings"
	"testing"
)

func TestLoadWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		load Load
		cpus int
		want string
	}{
		{"quiet: the bench's own load only", Load{Before: 0.05, During: []float64{0.4, 0.9, 1.1}, After: 1.2}, 2, ""},
		{"busy before", Load{Before: 1.5, During: []float64{1.6}, After: 1.4}, 2, "busy before the run: load average 1.50 on 2 CPUs"},
		{"busy during", Load{Before: 0.1, During: []float64{0.8, 2.3, 1.0}, After: 0.9}, 2, "busy during the run: load average up to 2.30"},
		{"busy at the end", Load{Before: 0.1, After: 2.2}, 2, "up to 2.20"},
		{"many CPUs take more", Load{Before: 0.5, During: []float64{4}, After: 3}, 16, ""},
		{"one CPU", Load{Before: 0.6}, 1, "busy before the run"},
	} {
		got := loadWarning(tc.load, tc.cpus)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestSampleLoad reads the real /proc/loadavg before and after (how many samples fall between
// depends on the time taken, so none is asserted).
func TestSampleLoad(t *testing.T) {
	s, err := sampleLoad(context.Background(), LoadInterval)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.stop(2)
	if err != nil || l.Before < 0 || l.After < 0 || !strings.HasPrefix(l.Describe(), "before ") {
		t.Fatalf("%+v, %v", l, err)
	}
}

// The CPU's busy share is what was not idle (idle and iowait) of the ticks between two reads;
// the machine's own /proc/stat reads.
func TestCPUBusy(t *testing.T) {
	before := cpuTimes{idle: 1000, total: 4000}
	if got := (cpuTimes{idle: 1300, total: 5000}).busySince(before); math.Abs(got-0.7) > 1e-12 {
		t.Errorf("busy %v, want 0.7", got)
	}
	if got := before.busySince(before); got != 0 {
		t.Errorf("no tick: busy %v, want 0", got)
	}
	now, err := readCPUTimes()
	if err != nil || now.total == 0 || now.idle > now.total {
		t.Errorf("/proc/stat: %+v, %v", now, err)
	}
}
