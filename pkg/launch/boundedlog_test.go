package launch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

// TestBoundedCopy: the first and last halves of the limit are kept, what falls between is
// counted and said where it was dropped; input within the limit is copied as it is. Reads of
// any size (one byte at a time too) give the same log.
func TestBoundedCopy(t *testing.T) {
	input := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a' + byte(i%26)
		}
		return b
	}
	for _, tc := range []struct {
		n, limit int
		dropped  int64
	}{{0, 10, 0}, {5, 10, 0}, {10, 10, 0}, {11, 10, 1}, {100, 10, 90}, {100_000, 1000, 99_000}, {7, 1, 6}} {
		in := input(tc.n)
		for name, r := range map[string]io.Reader{"whole": bytes.NewReader(in), "bytewise": iotest.OneByteReader(bytes.NewReader(in))} {
			var out bytes.Buffer
			dropped, err := boundedCopy(&out, r, int64(tc.limit), "stdout")
			if err != nil || dropped != tc.dropped {
				t.Errorf("%d bytes, limit %d, %s: dropped %d, %v; want %d", tc.n, tc.limit, name, dropped, err, tc.dropped)
				continue
			}
			head, tail := tc.limit/2, tc.limit-tc.limit/2
			want := string(in)
			if tc.dropped > 0 {
				want = string(in[:head]) + fmt.Sprintf("\n[readie: %s of this sandbox's stdout dropped here; limits.sandbox_output keeps its first and last %s]\n", mib(tc.dropped), mib(int64(tc.limit/2))) + string(in[tc.n-tail:])
			}
			if out.String() != want {
				t.Errorf("%d bytes, limit %d, %s: log %q, want %q", tc.n, tc.limit, name, trim(out.String()), trim(want))
			}
		}
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:150] + "..." + s[len(s)-150:]
	}
	return s
}

// TestTailFileReadsOnlyTheEnd: tailFile of a large log returns its last lines, reading only its
// end.
func TestTailFileReadsOnlyTheEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stderr.log")
	var b strings.Builder
	for i := range 100_000 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := tailFile(path, 2); got != "line 99998\nline 99999" {
		t.Errorf("tailFile = %q", got)
	}
	if got := tailFile(filepath.Join(t.TempDir(), "absent"), 2); got != "" {
		t.Errorf("tailFile of an absent file = %q", got)
	}
}

// TestLineWriter: the executor's output reaches an Output line by line, each after the
// sandbox's ID, whatever the writes' sizes; a line longer than maxLine comes in pieces (what
// it holds is bounded); an
// Output that fails changes nothing for the copy.
func TestLineWriter(t *testing.T) {
	var got bytes.Buffer
	w := &lineWriter{w: &got, prefix: "sb: "}
	for _, p := range []string{"one\ntw", "o\n", "", "three", "\nfour"} {
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	w.flush()
	if want := "sb: one\nsb: two\nsb: three\nsb: four\n"; got.String() != want {
		t.Errorf("lines %q, want %q", got.String(), want)
	}
	got.Reset()
	for range 2 * maxLine / 1000 {
		w.Write(bytes.Repeat([]byte("x"), 1000))
	}
	w.flush()
	lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
	if len(lines) != 2 || len(lines[0]) < len("sb: ")+maxLine || len(lines[0])+len(lines[1]) != 2*len("sb: ")+2*maxLine/1000*1000 {
		t.Errorf("a long line came as %d lines", len(lines))
	}
	// The executor is a stranger's: what would move a terminal's cursor, clear it, rewrite the
	// line or reverse the text after it reaches the Output escaped.
	got.Reset()
	w.Write([]byte("a\x1b[2Jb\rc\u202ed\xffe\tf\n"))
	if want := `sb: a\x1b[2Jb\x0dc\u202ed\xffe` + "\tf\n"; got.String() != want {
		t.Errorf("an escape sequence came as %q, want %q", got.String(), want)
	}
	broken := &lineWriter{w: failingWriter{}, prefix: "sb: "}
	if n, err := broken.Write([]byte("a\nb\n")); n != 4 || err != nil {
		t.Errorf("Write to a failing Output = %d, %v; want it swallowed", n, err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("closed") }
