package bench

import (
	"math"
	"testing"
	"time"
	_ "time/tzdata" // zones by name even on a machine without /usr/share/zoneinfo

	"readie.dev/pipeline/pkg/launch"
)

// The fixture is a real restore of the pandas image on this machine, with --debug.
func TestParseRestoreLogs(t *testing.T) {
	tl, err := parseRestoreLogs("../../testdata/runsc-restore-debug", 2026)
	if err != nil {
		t.Fatal(err)
	}
	// The pipeline's marks, written down from the log's own text (2026-12-02, UTC) rather than
	// from the parsed timeline, so a wrong parse shows: the restore command's first line is at
	// 12:10:24.742481 and the restore ends at 12:10:25.328913.
	at := func(sec, micro int) time.Time { return time.Date(2026, 12, 2, 12, 10, sec, micro*1000, time.UTC) }
	marks := launch.CallMarks{
		Began:     at(24, 742481-5000),
		Started:   at(25, 328913+20000),
		Connected: at(25, 328913+23000),
		Answered:  at(25, 328913+25000),
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

// TestExplainInAnyTimeZone: the breakdown does not depend on the machine's time zone, nor on
// the zone of the marks. The machine's zone is time.Local, set here for each zone (not
// parallel: no other test runs meanwhile), so one pass of the suite in one zone tests them all.
func TestExplainInAnyTimeZone(t *testing.T) {
	local := time.Local
	t.Cleanup(func() { time.Local = local })
	for _, zone := range []string{"America/New_York", "Asia/Kolkata", "UTC"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		time.Local = loc
		began := time.Date(2026, 12, 2, 12, 10, 24, 737481000, time.UTC).In(loc)
		answered := time.Date(2026, 12, 2, 12, 10, 25, 353913000, time.UTC).In(loc)
		b, err := Explain("pandas", "../../testdata/runsc-restore-debug", launch.CallMarks{Began: began, Started: answered, Connected: answered, Answered: answered})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(b.Spawn-5) > 0.5 {
			t.Errorf("%s: spawn = %.2f ms, want 5", zone, b.Spawn)
		}
	}
}

func TestParseRestoreLogsMissing(t *testing.T) {
	if _, err := parseRestoreLogs(t.TempDir(), 2026); err == nil {
		t.Fatal("no error for a directory without logs")
	}
}
