package launch

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// DefaultOutputLimit bounds what each of a sandbox's stdout and stderr leaves on disk, and what
// the pipeline holds of it in memory, when the runtime names no limit (limits.sandbox_output).
const DefaultOutputLimit = 16 << 20

// boundedCopy copies r to its end into w, keeping at most limit bytes of it: the first half as
// it comes (so a log read while the sandbox runs shows its start), the last half in a ring in
// memory, allocated only once the first half is full. What falls between is read and dropped
// (the sandbox must never block on a full pipe), counted, and said in a line written where it
// was dropped, before the kept end. what names the stream in that line. It returns the bytes
// dropped.
func boundedCopy(w io.Writer, r io.Reader, limit int64, what string) (dropped int64, err error) {
	head := limit / 2
	var total, written int64
	var ring []byte
	var next int // where the ring writes next
	full := false
	buf := make([]byte, 32<<10)
	for {
		n, rerr := r.Read(buf)
		total += int64(n)
		p := buf[:n]
		if written < head && len(p) > 0 {
			k := min(int64(len(p)), head-written)
			if _, err := w.Write(p[:k]); err != nil {
				return 0, err
			}
			written += k
			p = p[k:]
		}
		if len(p) > 0 && ring == nil {
			ring = make([]byte, limit-head)
		}
		for len(p) > 0 && len(ring) > 0 {
			if len(p) >= len(ring) {
				copy(ring, p[len(p)-len(ring):])
				next, full = 0, true
				break
			}
			c := copy(ring[next:], p)
			if next+c == len(ring) {
				full = true
			}
			next = (next + c) % len(ring)
			p = p[c:]
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return 0, rerr
		}
	}
	kept := int64(next)
	if full {
		kept = int64(len(ring))
	}
	dropped = total - written - kept
	if dropped > 0 {
		if _, err := fmt.Fprintf(w, "\n[readie: %s of this sandbox's %s dropped here; limits.sandbox_output keeps its first and last %s]\n",
			mib(dropped), what, mib(limit/2)); err != nil {
			return dropped, err
		}
	}
	if full {
		if _, err := w.Write(ring[next:]); err != nil {
			return dropped, err
		}
	}
	_, err = w.Write(ring[:next])
	return dropped, err
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// tailBytes is what tailFile reads of a log's end: enough for any number of lines an error
// quotes, never the whole log.
const tailBytes = 64 << 10

// tailFile returns the last n lines of the file at path, from its last tailBytes.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	offset := max(0, fi.Size()-tailBytes)
	data, err := io.ReadAll(io.NewSectionReader(f, offset, fi.Size()-offset))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if offset > 0 && len(lines) > 1 {
		lines = lines[1:] // the first may be cut
	}
	return lastLines(strings.Join(lines, "\n"), n)
}

// maxTailLines is how much of a deleted sandbox's stderr log it keeps for Tail.
const maxTailLines = 50

// lastLines returns the last n lines of text, without its final newlines.
func lastLines(text string, n int) string {
	if text == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
