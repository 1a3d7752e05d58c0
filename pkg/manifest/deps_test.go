package manifest_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
)

// TestWorkerKitDependencies: what a worker imports (manifest, executorproto, the spec shape,
// the runsc driver, the pool, the pickled calls, the catalogue's router) and the example worker
// pull in no go-runc, nothing under internal/, and nothing outside the standard library and
// this module but the OCI runtime-spec types and, for the pickled calls alone, og-rek and what
// it needs, as `go list -deps` reports it.
func TestWorkerKitDependencies(t *testing.T) {
	allowed := []string{"github.com/opencontainers/runtime-spec/specs-go",
		"github.com/kisielk/og-rek", "github.com/aristanetworks/gomap", "golang.org/x/exp/slices"}
	kit := []string{"./pkg/manifest", "./pkg/executorproto", "./pkg/sandbox", "./pkg/runsc", "./pkg/pool", "./pkg/pycall", "./pkg/catalogue", "./examples/worker"}
	for _, pkg := range kit {
		cmd := testenv.Command(t, 2*time.Minute, "go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		var outside []string
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, "github.com/containerd/go-runc") || strings.HasPrefix(dep, "readie.dev/pipeline/internal/") {
				t.Errorf("%s depends on %s: a worker's kit stands alone", pkg, dep)
			}
			if !strings.HasPrefix(dep, "readie.dev/pipeline/") && !slices.Contains(allowed, dep) {
				outside = append(outside, dep)
			}
		}
		if len(outside) > 0 {
			t.Errorf("%s depends on %v outside the standard library and this module; a worker's kit needs only %v", pkg, outside, allowed)
		}
	}
}
