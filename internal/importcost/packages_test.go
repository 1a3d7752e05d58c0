package importcost

import (
	"context"
	"io"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
)

// TestImagePackages reads the default image's distributions in a sandbox of it: numpy's
// distribution and version are the ones its metadata directory names (read here as data), a
// submodule maps to its top-level package's distribution, python_dateutil is normalized to
// python-dateutil and provides dateutil, the standard library has none; a second read starts no
// sandbox.
func TestImagePackages(t *testing.T) {
	rootfs := testenv.Rootfs(t)
	box := &starter{launcher: launch.Launcher{Runtime: testenv.Runtime(t), Rootfs: rootfs, WorkDir: testenv.WorkDir(t), Timeout: 2 * time.Minute}}
	log := logrus.New()
	log.SetOutput(io.Discard)
	a := &analyzer{o: Options{Jobs: 1}, cache: &cache{dir: t.TempDir()}, box: box, log: log, base: testKey()}
	a.scratchOnce.Do(func() {}) // the test's launcher has its own work directory
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// What Debian installed, from the names of the metadata directories (numpy-1.24.2.egg-info).
	want := map[string]string{}
	for _, pattern := range []string{"*.egg-info", "*.dist-info"} {
		dirs, _ := filepath.Glob(filepath.Join(rootfs, "usr/lib/python3/dist-packages", pattern))
		for _, d := range dirs {
			name, version, _ := strings.Cut(strings.TrimSuffix(strings.TrimSuffix(filepath.Base(d), ".egg-info"), ".dist-info"), "-")
			want[strings.ReplaceAll(strings.ToLower(name), "_", "-")] = version
		}
	}
	if want["numpy"] == "" {
		t.Fatalf("the default image has no numpy metadata directory: %v", want)
	}
	p, err := a.imagePackages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(p.Distributions, want) {
		t.Errorf("distributions %v, want %v (from the metadata directories)", p.Distributions, want)
	}
	for module, wantOf := range map[string]map[string]string{
		"numpy":        {"numpy": want["numpy"]},
		"numpy.linalg": {"numpy": want["numpy"]},
		"pandas":       {"pandas": want["pandas"]},
		"dateutil":     {"python-dateutil": want["python-dateutil"]},
		"json":         nil,
	} {
		if got := p.of(module); !maps.Equal(got, wantOf) || (wantOf == nil) != (got == nil) {
			t.Errorf("packages of %s: %v, want %v", module, got, wantOf)
		}
	}
	started := box.started.Load()
	if again, err := a.imagePackages(ctx); err != nil || !maps.Equal(again.Distributions, p.Distributions) || box.started.Load() != started {
		t.Errorf("second read: %v, %v; sandboxes %d -> %d", again, err, started, box.started.Load())
	}
}

// A read-only analysis whose cache predates the packages goes on without them, starting no
// sandbox.
func TestImagePackagesNotCached(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	box := &starter{}
	a := &analyzer{o: Options{CacheOnly: true}, cache: &cache{dir: t.TempDir(), readOnly: true}, box: box, log: log, base: testKey()}
	p, err := a.imagePackages(context.Background())
	if err != nil || p.Distributions != nil || p.of("numpy") != nil || box.started.Load() != 0 {
		t.Errorf("%+v, %v; sandboxes %d", p, err, box.started.Load())
	}
}

func TestDecodePackages(t *testing.T) {
	p, err := decodePackages("noise\npackages {\"distributions\": {\"numpy\": \"1.26.4\", \"bad\": \"1 2\"}, \"top_level\": {\"numpy\": [\"numpy\"]}}\n")
	if err != nil || p.Distributions["numpy"] != "1.26.4" || p.Distributions["bad"] != "" || !strings.Contains(p.Errors["bad"], "without white space") {
		t.Errorf("%+v, %v", p, err)
	}
	for _, out := range []string{"", "packages {", "packages {}"} {
		if _, err := decodePackages(out); err == nil {
			t.Errorf("%q: no error", out)
		}
	}
}

// TestDecodePackagesUntrusted: the probe runs the image's python, whose sitecustomize may print
// first (a look-alike line included): the probe's line is the last; what the image says of a
// distribution it cannot read is quoted and cut short before it reaches a log.
func TestDecodePackagesUntrusted(t *testing.T) {
	out := "packages {\"distributions\": {\"numpy\": \"9\"}, \"top_level\": {}}\n" +
		"packages {\"distributions\": {\"numpy\": \"1.26.4\"}, \"top_level\": {}, \"errors\": {\"/x\": \"\\u001b[2J" + strings.Repeat("a", 5000) + "\"}}\n"
	p, err := decodePackages(out)
	if err != nil || p.Distributions["numpy"] != "1.26.4" {
		t.Fatalf("%+v, %v; want the probe's own line", p.Distributions, err)
	}
	if why := p.Errors["/x"]; len(why) > 400 || strings.ContainsRune(why, 0x1b) {
		t.Errorf("error of %d bytes: %.100q", len(why), why)
	}
}
