package manifest_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestWorkerKitDependencies: what a worker imports (manifest, executorproto, the spec shape,
// the runsc driver and the pool) pulls in no go-runc, and nothing outside the standard library and
// this module but the OCI runtime-spec types, as `go list -deps` reports it.
func TestWorkerKitDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command on PATH: %v", err)
	}
	for _, pkg := range []string{"./pkg/manifest", "./pkg/executorproto", "./pkg/sandbox", "./pkg/runsc", "./pkg/pool"} {
		cmd := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		var outside []string
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, "github.com/containerd/go-runc") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
			if !strings.HasPrefix(dep, "readie.dev/pipeline/") {
				outside = append(outside, dep)
			}
		}
		if len(outside) > 0 && !slices.Equal(outside, []string{"github.com/opencontainers/runtime-spec/specs-go"}) {
			t.Errorf("%s depends on %v outside the standard library and this module; a worker's kit should need only runtime-spec", pkg, outside)
		}
	}
}
