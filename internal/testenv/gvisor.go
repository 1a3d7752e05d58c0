package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// PinnedGVisor returns the version of gVisor's module the Makefile (at makefile) pins as
// RUNSC_VERSION, and the directory of its source in the module cache, where `make runsc`
// downloaded it.
func PinnedGVisor(t testing.TB, makefile string) (version, dir string) {
	t.Helper()
	data, err := os.ReadFile(makefile)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUNSC_VERSION := (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s has no RUNSC_VERSION", makefile)
	}
	version = string(m[1])
	cache, err := Command(t, time.Minute, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(strings.TrimSpace(string(cache)), "gvisor.dev", "gvisor@"+version)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the pinned gVisor source is not in the module cache: %v (run `make runsc`)", err)
	}
	return version, dir
}
