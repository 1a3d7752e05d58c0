package bench

import (
	"math"
	"testing"
	"time"

	"readie.dev/pipeline/pkg/measure"
)

// The fixture is a real restore of the pandas image on this machine, with --debug.
func TestParseRestoreLogs(t *testing.T) {
	tl, err := parseRestoreLogs("../../testdata/runsc-restore-debug", 2026)
	if err != nil {
		t.Fatal(err)
	}
	at := func(ns int64) time.Time { return time.Unix(0, ns) }
	marks := measure.CallMarks{
		Began:     at(tl.processStart - 5e6),
		Started:   at(tl.restoreEnd + 20e6),
		Connected: at(tl.restoreEnd + 23e6),
		Answered:  at(tl.restoreEnd + 25e6),
	}
	b := explain("pandas", tl, marks)
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > 0.5 {
			t.Errorf("%s = %.2f ms, want %.2f", name, got, want)
		}
	}
	// From the log: restore starts 12:10:24.742481, cm.Restore RPC at .966237, pages
	// forked .026077 (s=25) to end .145392, kernel load .145416 to .310924, end Restore .328913.
	near("spawn", b.Spawn, 5)
	near("sandbox start", b.SandboxStart, 223.76)
	near("page load", b.PageLoad, 119.3)
	near("kernel load", b.KernelLoad, 165.5)
	near("runsc exit", b.RunscExit, 20)
	near("wake", b.Wake, 3)
	near("call", b.Call, 2)
	sum := b.Spawn + b.SandboxStart + b.PageLoad + b.KernelLoad + b.RestoreOther + b.RunscExit + b.Wake + b.Call
	near("sum of parts", sum, b.Total)
}

func TestParseRestoreLogsMissing(t *testing.T) {
	if _, err := parseRestoreLogs(t.TempDir(), 2026); err == nil {
		t.Fatal("no error for a directory without logs")
	}
}
