package output

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestRuntimeCheck: push takes only the runsc, helpers and rootfs the manifest records; another
// binary, another helper set or another rootfs is refused with ErrRuntime.
func TestRuntimeCheck(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	helpers := filepath.Join(dir, "gvisor-bin")
	rootfs := filepath.Join(dir, "rootfs")
	for path, data := range map[string]string{bin: "runsc", filepath.Join(helpers, runsc.Sentry): "sentry", filepath.Join(rootfs, manifest.RootfsInfoFile): `{"digest":"sha256:aa"}`} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rt := Runtime{Runsc: bin, Rootfs: rootfs}
	recorded := manifest.Manifest{
		Runsc:  manifest.Runsc{SHA256: filedigest.OfBytes([]byte("runsc")), Helpers: map[string]string{runsc.Sentry: filedigest.OfBytes([]byte("sentry"))}},
		Rootfs: manifest.Rootfs{Digest: "sha256:aa"},
	}
	if err := rt.check(&recorded); err != nil {
		t.Fatalf("the recorded runtime: %v", err)
	}
	for name, change := range map[string]func(m *manifest.Manifest){
		"runsc":   func(m *manifest.Manifest) { m.Runsc.SHA256 = filedigest.OfBytes([]byte("another runsc")) },
		"helpers": func(m *manifest.Manifest) { m.Runsc.Helpers = nil },
		"rootfs":  func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:bb" },
	} {
		m := recorded
		change(&m)
		if err := rt.check(&m); !errors.Is(err, ErrRuntime) {
			t.Errorf("another %s: %v, want ErrRuntime", name, err)
		}
	}
}
