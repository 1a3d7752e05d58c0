package filedigest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	os.WriteFile(path, []byte("abc"), 0o644)
	size, sum, err := Of(path)
	// sha256("abc"), as `sha256sum` prints it.
	if err != nil || size != 3 || sum != "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("Of = %d %s %v", size, sum, err)
	}
	if _, _, err := Of(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Of of a missing file = %v", err)
	}
}

func TestOfBytesAndFormat(t *testing.T) {
	// sha256("abc"), as `sha256sum` prints it: the same digest as Of gives for a file of it.
	want := "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := OfBytes([]byte("abc")); got != want {
		t.Fatalf("OfBytes = %s, want %s", got, want)
	}
	if got := Format([]byte{0x01, 0xab}); got != "sha256:01ab" {
		t.Fatalf("Format = %s", got)
	}
}
