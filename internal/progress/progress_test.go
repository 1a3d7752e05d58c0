package progress

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
)

// TestPlainLines: off a terminal, a line per step, and a byte count at each tenth only.
func TestPlainLines(t *testing.T) {
	var b bytes.Buffer
	m := NewLines(&b)
	m.Step("capture", 2, 5, "sets", "numpy captured")
	for done := int64(0); done <= 100<<20; done += 1 << 20 {
		m.Bytes("push: pandas", done, 100<<20)
	}
	m.Done()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if lines[0] != "capture: 2/5 sets, numpy captured" {
		t.Errorf("step line %q", lines[0])
	}
	if len(lines) != 1+11 || lines[1] != "push: pandas: 0.0 MiB/100.0 MiB (0%)" || lines[11] != "push: pandas: 100.0 MiB/100.0 MiB (100%)" || strings.Contains(b.String(), "\r") {
		t.Errorf("byte lines:\n%s", b.String())
	}
}

// TestTerminalLine: on a terminal one line rewritten in place, cleared for each log line and
// drawn again after it, and cleared at the end.
func TestTerminalLine(t *testing.T) {
	var b bytes.Buffer
	m := &Meter{w: &b, tty: true, shown: map[string]int64{}}
	logs := m.Logs(&b)
	m.Step("bench", 1, 24, "trials", "warm-up, small floor")
	logs.Write([]byte("a log line\n"))
	m.Step("bench", 2, 24, "trials", "warm-up, small cold")
	m.Done()
	want := "\r\033[Kbench: 1/24 trials, warm-up, small floor" + "\r\033[Ka log line\nbench: 1/24 trials, warm-up, small floor" +
		"\r\033[Kbench: 2/24 trials, warm-up, small cold" + "\r\033[K"
	if b.String() != want {
		t.Errorf("%q\nwant %q", b.String(), want)
	}
}

// TestQuietAndNil: -q gives no meter, and a nil meter says nothing and leaves logs alone.
func TestQuietAndNil(t *testing.T) {
	var m *Meter = New(os.Stderr, true)
	if m != nil {
		t.Fatal("a quiet meter")
	}
	m.Step("capture", 1, 2, "sets", "")
	m.Bytes("push", 1, 2)
	m.Done()
	var b bytes.Buffer
	if w := m.Logs(&b); w != &b {
		t.Error("a nil meter wraps the logs")
	}
	if f, err := os.Open(os.DevNull); err == nil {
		defer f.Close()
		if isTerminal(f) {
			t.Errorf("%s is taken for a terminal", os.DevNull)
		}
	}
}

// TestLogsAndStepsTogether: log lines and progress lines written from two goroutines to one
// writer that is no terminal (a buffer, as in the command tests) go through the meter's lock:
// `go test -race` catches a Logs that hands the writer back unguarded.
func TestLogsAndStepsTogether(t *testing.T) {
	var b bytes.Buffer
	m := NewLines(&b)
	logs := m.Logs(&b)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for j := range 50 {
				if i == 0 {
					m.Step("capture", j, 50, "sets", "")
				} else {
					logs.Write([]byte("a log line\n"))
				}
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != 100 {
		t.Errorf("%d lines, want 100", got)
	}
}
