package launch

import (
	"bytes"
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
