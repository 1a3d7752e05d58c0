package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckRootfs(t *testing.T) {
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, filepath.Dir(RootfsInfoFile)), 0o755)
	os.WriteFile(filepath.Join(rootfs, RootfsInfoFile), []byte(`{"digest": "sha256:aa"}`), 0o644)
	m := &Manifest{Rootfs: Rootfs{Path: "/elsewhere", Digest: "sha256:aa"}}
	if err := m.CheckRootfs(rootfs); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"relative": `rootfs "relative" is not an absolute path`,
		"/":        "rootfs / is not one the pipeline built",
	} {
		if err := m.CheckRootfs(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
	m.Rootfs.Digest = "sha256:bb"
	if err := m.CheckRootfs(rootfs); err == nil || !strings.Contains(err.Error(), "is sha256:aa, the checkpoints were captured on sha256:bb") {
		t.Errorf("another digest: %v", err)
	}
}
