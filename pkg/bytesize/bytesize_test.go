package bytesize

import (
	"errors"
	"flag"
	"io"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Size{
		"0": 0, "512": 512, "512B": 512, "1KiB": 1 << 10, "512MiB": 512 << 20, " 64GiB ": 64 << 30,
		"2TiB": 2 << 40, "100 MiB": 100 << 20, "4194304TiB": 1 << 62,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "64GB", "1.5GiB", "-1", "0x10", "4194305TiB", "99999999999999999999"} {
		if got, err := Parse(in); !errors.Is(err, ErrSize) {
			t.Errorf("Parse(%q) = %d, %v; want ErrSize", in, got, err)
		}
	}
}

// TestStringParses: String writes what Parse reads back, in the largest unit.
func TestStringParses(t *testing.T) {
	for s, want := range map[Size]string{0: "0", 1: "1B", 1536: "1536B", 100 << 20: "100MiB", 1536 << 10: "1536KiB", 3 << 30: "3GiB", 1 << 62: "4194304TiB"} {
		if got := s.String(); got != want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(s), got, want)
		}
		if back, err := Parse(s.String()); err != nil || back != s {
			t.Errorf("Parse(%q) = %d, %v; want %d", s.String(), back, err, int64(s))
		}
	}
}

// TestFlag: a Size is a flag.Value that reads sizes and refuses the rest.
func TestFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var memory Size
	fs.Var(&memory, "memory", "")
	if err := fs.Parse([]string{"-memory", "512MiB"}); err != nil || memory != 512<<20 {
		t.Errorf("-memory 512MiB = %d, %v", memory, err)
	}
	if err := fs.Parse([]string{"-memory", "512MB"}); err == nil {
		t.Error("-memory 512MB was accepted")
	}
}
