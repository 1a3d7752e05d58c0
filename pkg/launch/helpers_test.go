package launch_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/runsc"
)

// TestCheckHostHelpersOfTheRuntime: Output.CheckHost compares the manifest's runsc.helpers
// with the helpers the runtime's sandboxes boot with (Runtime.HelpersDir when set), not with
// whatever lies beside runsc: on an output captured here with the helpers of `make runsc`, the
// same runtime passes without a word about them; with an empty HelpersDir each helper is
// warned of as missing; with another sentry there the checkpoint does not restore (ErrHost).
func TestCheckHostHelpersOfTheRuntime(t *testing.T) {
	output, runscPath, root := openExample(t)
	if len(output.Manifest.Runsc.Helpers) != len(runsc.HelperNames()) {
		t.Fatalf("the output records the helpers %v: want runsc's %v, which `make runsc` lays out beside it", output.Manifest.Runsc.Helpers, runsc.HelperNames())
	}
	check := func(helpersDir string) ([]string, error) {
		rt := &launch.Runtime{Path: runscPath, Root: root, Flags: output.Flags, HelpersDir: helpersDir}
		return output.CheckHost(context.Background(), rt, "small")
	}
	if warnings, err := check(""); err != nil || strings.Contains(strings.Join(warnings, "\n"), "helper") {
		t.Errorf("CheckHost with runsc's own helpers = %q, %v; want no word about them", warnings, err)
	}

	empty := t.TempDir()
	warnings, err := check(empty)
	text := strings.Join(warnings, "\n")
	if err != nil || !strings.Contains(text, runsc.Sentry+" is missing") || !strings.Contains(text, runsc.Prewarmer+" is missing") {
		t.Errorf("CheckHost with HelpersDir %s (empty) = %q, %v; want both helpers warned of as missing", empty, warnings, err)
	}

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, runsc.Sentry), []byte("another sentry"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := check(other); !errors.Is(err, launch.ErrHost) || !strings.Contains(err.Error(), runsc.Sentry) {
		t.Errorf("CheckHost with another sentry in HelpersDir = %v; want ErrHost naming %s", err, runsc.Sentry)
	}
}

// TestRestorerBootsWithTheRuntimesHelpers: a sandbox of the kit's one restore path boots with
// the helpers of its Runtime's HelpersDir, as runsc's own debug log says: a copy of the helpers
// `make runsc` lays out, in a directory of the test's, is the one runsc names.
func TestRestorerBootsWithTheRuntimesHelpers(t *testing.T) {
	output, runscPath, _ := openExample(t)
	beside, err := (&runsc.Runsc{Path: runscPath}).ResolvedHelpersDir()
	if err != nil {
		t.Fatal(err)
	}
	work := testenv.WorkDir(t)
	helpers, logs, root := filepath.Join(work, "helpers"), filepath.Join(work, "logs"), filepath.Join(work, "root")
	if err := os.Mkdir(helpers, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range runsc.HelperNames() {
		data, err := os.ReadFile(filepath.Join(beside, name))
		if err != nil {
			t.Fatalf("runsc's helper %s (`make runsc` lays it out): %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(helpers, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, runscPath, root, "")
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	rt := &launch.Runtime{Path: runscPath, Root: root, Flags: output.Flags, HelpersDir: helpers, DebugLogDir: logs}
	r, err := output.Restorer(launch.Options{Runtime: rt, WorkDir: filepath.Join(work, "w"), IDs: launch.RandomIDs{Prefix: "helpers"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restored, err := r.Restore(ctx, "small", launch.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := restored.Close(ctx); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(logs, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no runsc debug log in %s: %v", logs, err)
	}
	var text strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text.Write(data)
	}
	for _, want := range []string{
		fmt.Sprintf("Sidecar %q found: booting sandbox with %s", runsc.Sentry, filepath.Join(helpers, runsc.Sentry)),
		fmt.Sprintf("Sidecar %q found: prepending Sentry boot command with %s", runsc.Prewarmer, filepath.Join(helpers, runsc.Prewarmer)),
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("runsc's logs in %s do not say %q: the restorer's sandbox did not boot with the runtime's helpers", logs, want)
		}
	}
}
