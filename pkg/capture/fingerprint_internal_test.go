package capture

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestSpecFingerprintChecked: the fingerprint a capture records is that of the spec it runs;
// a caller's expected fingerprint (the run's restore spec) is checked against it, never
// recorded in its place, so manifest.Verify's meta-against-manifest comparison still means
// something. No sandbox starts: newSandbox only writes the bundle.
func TestSpecFingerprintChecked(t *testing.T) {
	rt := &launch.Runtime{Path: "/bin/false", Root: t.TempDir(), Flags: sandbox.DefaultFlags(), Lease: testenv.Lease(t)}
	work := testenv.WorkDir(t)
	req := Request{ID: "x", Rootfs: "/rootfs", Dir: filepath.Join(work, "img"), WorkDir: work, Timeout: time.Minute}
	_, computed, err := newSandbox(rt, req)
	if err != nil {
		t.Fatal(err)
	}

	req.Dir = filepath.Join(work, "img2")
	req.SpecFingerprint = computed
	if _, got, err := newSandbox(rt, req); err != nil || got != computed {
		t.Fatalf("with the right expected fingerprint: got %q, %v; want %q", got, err, computed)
	}

	req.Dir = filepath.Join(work, "img3")
	req.SpecFingerprint = "sha256:" + "00000000000000000000000000000000000000000000000000000000000000ff"
	_, got, err := newSandbox(rt, req)
	if !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("a capture whose spec differs from the expected shape: got %q, %v; want ErrSpecMismatch", got, err)
	}
	if _, err := os.Stat(req.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused capture made its directory %s: %v", req.Dir, err)
	}
}
