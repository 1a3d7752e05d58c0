package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestProbeSaysWhatIsMissing: in a real sandbox, a python3 that exits with one of the probe's
// codes (too old, no cloudpickle) is refused with what it said; one that exits otherwise is
// refused as a python3 that does not run, with its exit status. The image is a static busybox
// whose python3 is a shell script.
func TestProbeSaysWhatIsMissing(t *testing.T) {
	rt := testenv.Runtime(t)
	for _, tc := range []struct {
		script string
		want   []string
	}{
		{`echo "python3 3.9 is older than 3.11"; exit 3`, []string{"python3 3.9 is older than 3.11"}},
		{`echo "cloudpickle is missing"; exit 4`, []string{"cloudpickle is missing"}},
		{`echo "Segmentation fault"; exit 5`, []string{"python3 does not run", "exit status 5"}},
	} {
		base := t.TempDir()
		for _, dir := range []string{"bin", "usr/bin", "proc", "dev", "sys", "tmp", "etc"} {
			if err := os.MkdirAll(filepath.Join(base, dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		busybox, err := os.ReadFile("/usr/bin/busybox")
		if err != nil {
			t.Fatalf("a static busybox (Debian's busybox-static) is needed: %v", err)
		}
		if err := os.WriteFile(filepath.Join(base, "bin/busybox"), busybox, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, "usr/bin/python3"), []byte("#!/bin/busybox sh\n"+tc.script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		code := newImageCode(rt, time.Minute, "busybox", sandbox.Process{})
		_, err = code.probe(ctx, base, t.TempDir())
		cancel()
		if !errors.Is(err, ErrPython) {
			t.Errorf("python3 `%s`: probe = %v; want ErrPython", tc.script, err)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("python3 `%s`: probe = %v; want it to say %q", tc.script, err, want)
			}
		}
	}
}
