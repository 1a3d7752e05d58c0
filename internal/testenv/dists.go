package testenv

import (
	"path/filepath"
	"strings"
	"testing"
)

// Distributions returns the distributions installed in the directory site of a rootfs, as the
// names of their .dist-info and .egg-info directories say (read as data: NAME-VERSION.*-info),
// PEP 503 normalized name to version: what a test expects the executor to find in their
// metadata.
func Distributions(t testing.TB, site string) map[string]string {
	t.Helper()
	dists := map[string]string{}
	for _, pattern := range []string{"*.dist-info", "*.egg-info"} {
		dirs, err := filepath.Glob(filepath.Join(site, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			base := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(d), ".dist-info"), ".egg-info")
			name, version, _ := strings.Cut(base, "-")
			dists[strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(name))] = version
		}
	}
	if len(dists) == 0 {
		t.Fatalf("no .dist-info or .egg-info directory in %s", site)
	}
	return dists
}
