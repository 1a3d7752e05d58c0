package launch_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestCheckRuntimeDir: a runtime directory whose runsc and helpers are the manifest's, in a
// directory of this user's alone, passes, its paths absolute; anything else is refused
// before anything in it could run: a directory others can enter, a runsc that is a symbolic
// link (to the very runsc recorded), another runsc, a helper missing or added, a manifest
// without runsc's sha256. (The worker and check-host tests run it on a pulled runtime.)
func TestCheckRuntimeDir(t *testing.T) {
	m := &manifest.Manifest{
		Runsc:  manifest.Runsc{SHA256: filedigest.OfBytes([]byte("runsc")), Helpers: map[string]string{runsc.Sentry: filedigest.OfBytes([]byte("sentry"))}},
		Rootfs: manifest.Rootfs{Digest: "sha256:aa"},
	}
	lay := func(t *testing.T) string {
		dir := t.TempDir()
		os.Chmod(dir, 0o700) // t.TempDir's others can enter
		os.Mkdir(filepath.Join(dir, launch.RuntimeHelpers), 0o755)
		for name, data := range map[string]string{launch.RuntimeRunsc: "runsc", filepath.Join(launch.RuntimeHelpers, runsc.Sentry): "sentry"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	dir := lay(t)
	t.Chdir(filepath.Dir(dir))
	got, err := launch.CheckRuntimeDir(filepath.Base(dir), m)
	if err != nil || got != launch.RuntimeIn(dir) {
		t.Fatalf("the manifest's runtime: %+v, %v; want %+v", got, err, launch.RuntimeIn(dir))
	}

	for name, tc := range map[string]struct {
		change func(t *testing.T, dir string)
		m      func(m *manifest.Manifest)
		want   error
	}{
		"mode 0755": {change: func(t *testing.T, dir string) { os.Chmod(dir, 0o755) }, want: launch.ErrNotPrivate},
		"runsc a symbolic link": {change: func(t *testing.T, dir string) {
			recorded := filepath.Join(t.TempDir(), "runsc")
			os.WriteFile(recorded, []byte("runsc"), 0o755)
			os.Remove(filepath.Join(dir, launch.RuntimeRunsc))
			os.Symlink(recorded, filepath.Join(dir, launch.RuntimeRunsc))
		}, want: limitread.ErrNotRegular},
		"another runsc": {change: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, launch.RuntimeRunsc), []byte("#!/bin/sh\n"), 0o755)
		}, want: manifest.ErrRuntime},
		"the sentry missing": {change: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, launch.RuntimeHelpers, runsc.Sentry))
		}, want: manifest.ErrRuntime},
		"a prewarmer added": {change: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, launch.RuntimeHelpers, runsc.Prewarmer), []byte("prewarmer"), 0o755)
		}, want: manifest.ErrRuntime},
		"no runsc sha256 recorded": {m: func(m *manifest.Manifest) { m.Runsc.SHA256 = "" }, want: manifest.ErrRuntime},
	} {
		t.Run(name, func(t *testing.T) {
			dir, m := lay(t), *m
			if tc.change != nil {
				tc.change(t, dir)
			}
			if tc.m != nil {
				tc.m(&m)
			}
			if _, err := launch.CheckRuntimeDir(dir, &m); !errors.Is(err, tc.want) {
				t.Errorf("%v, want %v", err, tc.want)
			}
		})
	}
}
