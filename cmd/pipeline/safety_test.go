package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
)

// TestNeverReplacesAStranger: a directory that holds files the pipeline did not write is never
// taken as an output to replace, by capture, pull or merge: exit 2, naming it, and its files
// are untouched.
func TestNeverReplacesAStranger(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	layout := "oci-layout:" + filepath.Join(dir, "layout") + ":v1"
	if code, _, stderr := runCLI(t, "push", "--config", cfg, layout); code != exitOK {
		t.Fatalf("push: exit %d\n%s", code, stderr)
	}
	home := filepath.Join(dir, "home")
	os.MkdirAll(home, 0o755)
	notes := filepath.Join(home, "notes.txt")
	os.WriteFile(notes, []byte("precious"), 0o644)
	for _, args := range [][]string{
		{"pull", "--config", cfg, layout, home},
		{"capture", "--config", cfg, "--out", home},
		{"merge", "--config", cfg, "--out", home, out},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage || !strings.Contains(stderr, home) || !strings.Contains(stderr, "notes.txt") {
			t.Errorf("%s into a directory with notes.txt: exit %d, want 2 naming it\n%s", args[0], code, stderr)
		}
		if data, err := os.ReadFile(notes); err != nil || string(data) != "precious" {
			t.Fatalf("%s touched notes.txt: %q %v", args[0], data, err)
		}
		if entries, _ := os.ReadDir(home); len(entries) != 1 {
			t.Fatalf("%s wrote into the directory: %v", args[0], entries)
		}
	}
}

// TestReadersVerifyFirst: smoke, measure and bench verify an output before they restore
// anything; a changed byte fails them (exit 1) and nothing is written.
func TestReadersVerifyFirst(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	manifestPath := filepath.Join(out, manifest.FileName)
	pages := filepath.Join(out, "js", "pages.img")
	os.Chmod(pages, 0o600) // the test changes what the pipeline keeps read-only
	flipByte(t, pages, 4096)
	before, _ := os.ReadFile(manifestPath)
	for _, args := range [][]string{
		{"smoke", "--config", cfg},
		{"measure", "--config", cfg, "--runs", "1"},
		{"bench", "--config", cfg, "--rounds", "1", "--variants=false", "--concurrency", ""},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitFailed || !strings.Contains(stderr, "does not verify") || !strings.Contains(stderr, pages) {
			t.Errorf("%s of a changed output: exit %d, want 1 naming %s\n%s", args[0], code, pages, stderr)
		}
		if after, _ := os.ReadFile(manifestPath); !bytes.Equal(before, after) {
			t.Fatalf("%s rewrote the manifest of an output that does not verify", args[0])
		}
	}
	if _, err := os.Stat(filepath.Join(out, "bench")); !os.IsNotExist(err) {
		t.Error("bench wrote into an output that does not verify")
	}
}
