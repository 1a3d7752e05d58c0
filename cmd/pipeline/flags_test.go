package main

import (
	"os"
	"path/filepath"
	"testing"

	"readie.dev/pipeline/internal/config"
)

// TestDefaultsWithoutConfig: with no config file at all, the defaults $READIE_DEFAULTS names
// still apply (the pipeline's image finds its runsc so, in any directory).
func TestDefaultsWithoutConfig(t *testing.T) {
	dir := t.TempDir()
	defaults := filepath.Join(dir, "defaults.yaml")
	os.WriteFile(defaults, []byte("runsc:\n  path: /usr/local/bin/runsc\n"), 0o644)
	t.Setenv(config.DefaultsEnv, defaults)
	t.Chdir(dir)
	cfg, err := (&configFlag{path: defaultConfigPath}).load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runsc.Path != "/usr/local/bin/runsc" {
		t.Errorf("runsc.path %s, want the defaults file's", cfg.Runsc.Path)
	}
}
