// Package progress tells a person what a long command is doing as it goes: on a terminal one
// compact line, rewritten in place at each step ("capture: 2/5 sets, numpy"); elsewhere (a
// pipe, a file, CI) the same as plain lines; with -q nothing. A nil *Meter reports nothing, so
// code that may run without one holds a nil.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Meter writes progress lines to one writer (stderr).
type Meter struct {
	mu  sync.Mutex
	w   io.Writer
	tty bool
	// line is what the terminal shows now, to be redrawn after a log line (Logs).
	line string
	// shown is the last fraction of a byte count written as a plain line, in tenths.
	shown map[string]int64
}

// New returns a meter writing to w, in place when w is a terminal; nil when quiet.
func New(w io.Writer, quiet bool) *Meter {
	if quiet {
		return nil
	}
	return &Meter{w: w, tty: isTerminal(w), shown: map[string]int64{}}
}

// NewLines returns a meter writing plain lines to w whatever it is (for tests, and for a w
// that is no terminal).
func NewLines(w io.Writer) *Meter { return &Meter{w: w, shown: map[string]int64{}} }

// isTerminal reports whether w is a terminal: a file that answers a terminal's ioctl (a
// character device alone may be /dev/null).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// Step says that done of total units of what are done ("capture", 2, 5, "sets", "numpy"):
// "capture: 2/5 sets, numpy".
func (m *Meter) Step(what string, done, total int, unit, detail string) {
	if m == nil {
		return
	}
	line := fmt.Sprintf("%s: %d/%d %s", what, done, total, unit)
	if detail != "" {
		line += ", " + detail
	}
	m.show(line)
}

// Bytes says that done of total bytes of what are through: on a terminal at every call, as
// plain lines at each tenth only.
func (m *Meter) Bytes(what string, done, total int64) {
	if m == nil {
		return
	}
	line := fmt.Sprintf("%s: %s/%s", what, mib(done), mib(total))
	if total > 0 {
		line += fmt.Sprintf(" (%d%%)", done*100/total)
	}
	m.mu.Lock()
	tenth := int64(10)
	if total > 0 {
		tenth = done * 10 / total
	}
	last, seen := m.shown[what]
	if !m.tty {
		if seen && tenth <= last {
			m.mu.Unlock()
			return
		}
		m.shown[what] = tenth
	}
	m.mu.Unlock()
	m.show(line)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func (m *Meter) show(line string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.tty {
		fmt.Fprintln(m.w, line)
		return
	}
	fmt.Fprintf(m.w, "\r\033[K%s", line)
	m.line = line
}

// Done ends the line a terminal shows, so that what follows starts on a line of its own.
func (m *Meter) Done() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tty && m.line != "" {
		fmt.Fprint(m.w, "\r\033[K")
		m.line = ""
	}
}

// Logs returns a writer for log lines to the meter's writer, under the meter's lock, so that a
// log line and a progress line from two goroutines never interleave: on a terminal each log
// line clears the progress line, is written whole, and the progress line is drawn again.
func (m *Meter) Logs(w io.Writer) io.Writer {
	if m == nil {
		return w
	}
	return logWriter{m: m, w: w}
}

type logWriter struct {
	m *Meter
	w io.Writer
}

func (l logWriter) Write(p []byte) (int, error) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.line != "" {
		fmt.Fprint(l.w, "\r\033[K")
	}
	n, err := l.w.Write(p)
	if l.m.line != "" {
		fmt.Fprint(l.w, l.m.line)
	}
	return n, err
}
