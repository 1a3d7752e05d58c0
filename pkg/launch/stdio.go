package launch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/runsc"
)

// stdio gives the sandbox pipes (a restored process with a regular file for stdout would write
// at its old offset) and copies what comes out of them into log files, each bounded by limit,
// and line by line into an optional output from the same copy.
type stdio struct {
	outR, outW, errR, errW *os.File
	done                   chan error
	closeOnce              sync.Once
	handedOver             atomic.Bool
	// dropped counts what the limit left out of the stdout and the stderr log.
	dropped [2]atomic.Int64
}

// newStdio opens the logs and the pipes and starts their copies; output, when not nil, gets
// each line after id.
func newStdio(stdoutPath, stderrPath string, limit int64, output io.Writer, id string) (*stdio, error) {
	outFile, err := os.OpenFile(stdoutPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	errFile, err := os.OpenFile(stderrPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		outFile.Close()
		return nil, err
	}
	s := &stdio{done: make(chan error, 2)}
	if s.outR, s.outW, err = os.Pipe(); err == nil {
		s.errR, s.errW, err = os.Pipe()
	}
	if err != nil {
		outFile.Close()
		errFile.Close()
		return nil, err
	}
	for i, p := range []struct {
		r    *os.File
		dest *os.File
		what string
	}{{s.outR, outFile, "stdout"}, {s.errR, errFile, "stderr"}} {
		go func() {
			var w io.Writer = p.dest
			var lines *lineWriter
			if output != nil {
				lines = &lineWriter{w: output, prefix: id + ": "}
				w = io.MultiWriter(p.dest, lines)
			}
			dropped, err := boundedCopy(w, p.r, limit, p.what)
			if lines != nil {
				lines.flush()
			}
			s.dropped[i].Store(dropped)
			p.r.Close()
			err = errors.Join(err, p.dest.Close())
			s.done <- err
		}()
	}
	return s, nil
}

// childEnds are the write ends, for the runsc command that hands them to the process.
func (s *stdio) childEnds() runsc.IO { return runsc.IO{Stdout: s.outW, Stderr: s.errW} }

// attached reports whether a runsc command has already been given the pipes.
func (s *stdio) attached() bool { return s.handedOver.Load() }

// closeChildEnds closes this process's copies of the write ends once runsc has them; the
// pipes reach EOF when the sandbox is gone too.
func (s *stdio) closeChildEnds() {
	s.closeOnce.Do(func() {
		s.handedOver.Store(true)
		s.outW.Close()
		s.errW.Close()
	})
}

func (s *stdio) wait(limit time.Duration) error {
	s.closeChildEnds()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var errs []error
	for range 2 {
		select {
		case err := <-s.done:
			errs = append(errs, err)
		case <-timer.C:
			// Something outside the sandbox still holds a write end; stop waiting for it.
			s.outR.Close()
			s.errR.Close()
			return fmt.Errorf("sandbox output still open %s after delete", limit)
		}
	}
	return errors.Join(errs...)
}

// maxLine is the longest line a lineWriter holds before it writes it out as it is.
const maxLine = 64 << 10

// lineWriter writes whole lines to w, each after prefix and escaped (pycall.Text), in one
// Write each. It never fails:
// the copy it is fed from must drain the sandbox's pipe whatever w does, so w's errors are
// dropped.
type lineWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.buf = append(l.buf, p...)
			if len(l.buf) >= maxLine {
				l.flush()
			}
			break
		}
		l.buf = append(l.buf, p[:i]...)
		l.flush()
		p = p[i+1:]
	}
	return n, nil
}

// flush writes what is held as one line, escaped: the executor is a stranger's, and the line
// may reach a terminal.
func (l *lineWriter) flush() {
	if len(l.buf) == 0 {
		return
	}
	text := pycall.Text(string(l.buf), 4*len(l.buf)) // an escape is at most 4 bytes a byte
	line := make([]byte, 0, len(l.prefix)+len(text)+1)
	line = append(append(append(line, l.prefix...), text...), '\n')
	l.w.Write(line)
	l.buf = l.buf[:0]
}

// lockedWriter serializes the writes of many sandboxes' copies into one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
