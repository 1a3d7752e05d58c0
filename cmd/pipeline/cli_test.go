package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// The conventions people expect of a command line: help on stdout with exit 0 (`-h`, `--help`,
// `help COMMAND`), `--version`, one JSON document on stdout from every command that reports
// with `--log-format json`, and `make help`.

// leafCommand is a command that runs, by the words after "pipeline" ("capture", "cache list").
type leafCommand struct {
	words []string
	cmd   command
}

func (l leafCommand) path() string { return strings.Join(l.words, " ") }

// leafCommands lists every command that runs, descending into groups.
func leafCommands() []leafCommand {
	var leaves []leafCommand
	var walk func(set commandSet, words []string)
	walk = func(set commandSet, words []string) {
		for _, c := range set.commands {
			w := append(slices.Clone(words), c.Name())
			if g, ok := c.(*group); ok {
				walk(g.set, w)
				continue
			}
			leaves = append(leaves, leafCommand{words: w, cmd: c})
		}
	}
	walk(commands(), nil)
	return leaves
}

// ownFlags are the flags cmd registers itself, without the log flags every command takes.
func ownFlags(cmd command) []string {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	cmd.SetFlags(fs)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// TestHelp: help asked for is output: on stdout, exit 0, nothing on stderr, by -h, --help and
// `help`; `help COMMAND` is the command's own (its usage and every flag), the same as
// `COMMAND -h`, groups included. No command, an unknown one, or a stray word is exit 2 on stderr.
func TestHelp(t *testing.T) {
	t.Parallel()
	leaves := leafCommands()
	if len(leaves) < 15 {
		t.Fatalf("found only %d commands", len(leaves))
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "usage: pipeline <command>") || !strings.Contains(stdout, "pipeline help <command>") {
			t.Errorf("pipeline %s: exit %d\nstdout:\n%s\nstderr:\n%s", args[0], code, stdout, stderr)
		}
		for _, c := range commands().commands {
			if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(c.Name()) + ` +\S`).MatchString(stdout) {
				t.Errorf("pipeline %s does not list %s:\n%s", args[0], c.Name(), stdout)
			}
		}
	}
	for _, l := range leaves {
		code, stdout, stderr := runCLI(t, append([]string{"help"}, l.words...)...)
		if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "usage: pipeline "+l.cmd.Usage()+"\n") {
			t.Errorf("pipeline help %s: exit %d\nstdout:\n%s\nstderr:\n%s", l.path(), code, stdout, stderr)
			continue
		}
		for _, name := range append(ownFlags(l.cmd), "log-format", "v") {
			if !regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + `\b`).MatchString(stdout) {
				t.Errorf("pipeline help %s does not list -%s:\n%s", l.path(), name, stdout)
			}
		}
		for _, asked := range []string{"-h", "--help"} {
			code, again, stderr := runCLI(t, append(slices.Clone(l.words), asked)...)
			if code != exitOK || stderr != "" || again != stdout {
				t.Errorf("pipeline %s %s: exit %d, stderr %q; its stdout differs from `pipeline help %s`'s:\n%s", l.path(), asked, code, stderr, l.path(), again)
			}
		}
	}
	for _, args := range [][]string{{"help", "cache"}, {"cache", "-h"}, {"cache", "help"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "usage: pipeline cache <command>") || !strings.Contains(stdout, "  prune-rootfs ") {
			t.Errorf("pipeline %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: pipeline <command>"},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "cache", "frob"}, `unknown command "frob"`},
		{[]string{"help", "capture", "extra"}, "unexpected arguments: extra"},
		{[]string{"capture", "--bogus"}, "flag provided but not defined: --bogus"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("pipeline %s: exit %d, want 2 saying %q on stderr\nstdout:\n%s\nstderr:\n%s", strings.Join(tc.args, " "), code, tc.want, stdout, stderr)
		}
	}
}

// TestVersion: `--version`, `-version` and `version` print the same, with the runsc the config
// names (the real one) and the executor protocol; as JSON with --log-format json; a runsc that
// is not installed is said so, exit 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig{runsc: testenv.RunscPath(t), root: filepath.Join(dir, "root"), rootfs: "/f", output: filepath.Join(dir, "out")}.write(t)
	code, stdout, stderr := runCLI(t, "version", "--config", cfg)
	if code != exitOK || !strings.HasPrefix(stdout, "pipeline ") || !strings.Contains(stdout, "\nexecutor protocol 2\n") || !strings.Contains(stdout, "\nrunsc readie-") {
		t.Fatalf("version: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, flagName := range []string{"--version", "-version"} {
		if code, again, stderr := runCLI(t, flagName, "--config", cfg); code != exitOK || again != stdout {
			t.Errorf("pipeline %s: exit %d\n%s%s\nwant what `pipeline version` printed:\n%s", flagName, code, again, stderr, stdout)
		}
	}
	code, stdout, stderr = runCLI(t, "--version", "--config", cfg, "--log-format", "json")
	var v versions
	if err := decodeOne(stdout, &v); err != nil || code != exitOK || v.ExecutorProtocol != executorproto.Version || !strings.HasPrefix(v.Runsc.Version, "readie-") ||
		v.Runsc.Module != "gvisor.dev/gvisor" || v.Pipeline == "" {
		t.Errorf("--version as JSON: exit %d, %v, %+v\n%s%s", code, err, v, stdout, stderr)
	}

	absent := testConfig{runsc: filepath.Join(dir, "no-runsc"), root: filepath.Join(dir, "root"), rootfs: "/f", output: filepath.Join(dir, "out")}.write(t)
	code, stdout, stderr = runCLI(t, "version", "--config", absent)
	if code != exitOK || !strings.Contains(stdout, "runsc: not installed at "+filepath.Join(dir, "no-runsc")) {
		t.Errorf("version without runsc: exit %d\n%s%s", code, stdout, stderr)
	}
}

// decodeOne decodes the one JSON document that text holds into v: an error when it holds none,
// more than one, or something else after it.
func decodeOne(text string, v any) error {
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(v); err != nil {
		return err
	}
	var more json.RawMessage
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON document, or text after it")
	}
	return nil
}

// TestJSONFromEveryCommand: with --log-format json, every command that reports writes one JSON
// document on stdout, on a real output, each holding what it reports. Every command the
// pipeline has is run here but three whose runs are long and made elsewhere anyway: analyze and
// plan-sets (TestAnalyzePlanCaptureSelect decodes theirs) and bench (TestBenchShort).
func TestJSONFromEveryCommand(t *testing.T) {
	t.Parallel()
	elsewhere := map[string]string{"analyze": "TestAnalyzePlanCaptureSelect", "plan-sets": "TestAnalyzePlanCaptureSelect", "bench": "TestBenchShort"}
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	layout := "oci-layout:" + filepath.Join(dir, "layout") + ":v1"
	base, baseDigest, cache := defaultImageBase(t)

	// key: a top-level field the document must hold, not null; "[]": a non-empty array.
	runs := []struct {
		args []string
		key  string
		env  map[string]string // when set: a process of its own with these in its environment
	}{
		{[]string{"capture", "--config", cfg}, "sets", nil},
		{[]string{"plan", "--config", cfg}, "sets", nil},
		{[]string{"verify", "--config", cfg}, "checkpoints", nil},
		{[]string{"measure", "--config", cfg, "--runs", "1"}, "checkpoints", nil},
		{[]string{"smoke", "--config", cfg}, "checkpoints", nil},
		{[]string{"check-host", "--config", cfg}, "checkpoints", nil},
		{[]string{"push", "--config", cfg, layout}, "reference", nil},
		{[]string{"pull", "--config", cfg, layout, filepath.Join(dir, "pulled")}, "checkpoints", nil},
		{[]string{"merge", "--config", cfg, "--out", filepath.Join(dir, "merged"), out}, "checkpoints", nil},
		{[]string{"select", "--config", cfg, "json"}, "cold", nil},
		{[]string{"cache", "list", "--config", cfg}, "[]", nil},
		{[]string{"cache", "prune", "--config", cfg, "--older-than", "1ns", "--dry-run"}, "entries", nil},
		// prune-rootfs looks at {cache}/rootfs: an empty cache of its own.
		{[]string{"cache", "prune-rootfs", "--config", cfg, "--dry-run"}, "dirs", map[string]string{"XDG_CACHE_HOME": t.TempDir()}},
		// The default image's package layer, as `make image` names it: the rootfs `make image`
		// made of it (make test runs make image first), reused, nothing written.
		{[]string{"rootfs", "--config", cfg, "--base", base, "--base-digest", baseDigest, "--cache", cache}, "rootfs", nil},
		{[]string{"spec", "--config", cfg}, "fingerprint", nil},
		{[]string{"version", "--config", cfg}, "runsc", nil},
	}
	ran := map[string]bool{}
	for _, r := range runs {
		args := append(slices.Clone(r.args), "--log-format", "json")
		var code int
		var stdout, stderr string
		if r.env != nil {
			code, stdout, stderr = runProcess(t, r.env, 5*time.Minute, args...)
		} else {
			code, stdout, stderr = runCLI(t, args...)
		}
		name := r.args[0]
		if name == "cache" {
			name += " " + r.args[1]
		}
		ran[name] = true
		var doc any
		if err := decodeOne(stdout, &doc); err != nil || code != exitOK {
			t.Errorf("%s: exit %d, %v\nstdout:\n%s\nstderr:\n%s", name, code, err, stdout, stderr)
			continue
		}
		switch d := doc.(type) {
		case map[string]any:
			if d[r.key] == nil {
				t.Errorf("%s: its JSON has no %q:\n%s", name, r.key, stdout)
			}
		case []any:
			if r.key != "[]" || len(d) == 0 {
				t.Errorf("%s: its JSON is an array, want an object with %q:\n%s", name, r.key, stdout)
			}
		default:
			t.Errorf("%s: its JSON is %T:\n%s", name, doc, stdout)
		}
		switch name {
		case "verify", "pull":
			var v verified
			json.Unmarshal([]byte(stdout), &v)
			if !slices.Equal(v.Checkpoints, []string{"empty", "js"}) || v.ExecutorProtocol != executorproto.Version || v.RunscVersion == "" {
				t.Errorf("%s: %+v", name, v)
			}
		case "rootfs":
			var r struct {
				Rootfs string `json:"rootfs"`
				Reused bool   `json:"reused"`
			}
			json.Unmarshal([]byte(stdout), &r)
			info, err := manifest.ReadRootfsInfo(r.Rootfs)
			if err != nil || info.BaseDigest != baseDigest || !r.Reused {
				t.Errorf("rootfs of the default image's base: %+v, %v; want one reused, of base %s (not reused: run `make image`, which makes it)", r, err, baseDigest)
			}
		}
	}
	for _, l := range leafCommands() {
		if !ran[l.path()] && elsewhere[l.path()] == "" {
			t.Errorf("pipeline %s: no test decodes its JSON: add it here", l.path())
		}
	}
}

// defaultImageBase returns the package layer that `make image` put the executor on (the base
// whose digest the default rootfs records), its digest, and the cache both are under.
func defaultImageBase(t *testing.T) (base, digest, cache string) {
	t.Helper()
	rootfs := testenv.Rootfs(t)
	info, err := manifest.ReadRootfsInfo(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	cache = filepath.Dir(filepath.Dir(filepath.Dir(rootfs))) // CACHE/rootfs/sha256-.../rootfs
	layers, _ := filepath.Glob(filepath.Join(cache, "rootfs", "layers", "*", "digest"))
	for _, path := range layers {
		data, err := os.ReadFile(path)
		if err == nil && "sha256:"+strings.TrimSpace(string(data)) == info.BaseDigest {
			return filepath.Join(filepath.Dir(path), "rootfs"), info.BaseDigest, cache
		}
	}
	t.Fatalf("no package layer of digest %s under %s (run `make image`)", info.BaseDigest, cache)
	return "", "", ""
}

// TestMakeHelp: `make help` prints one line per target of the Makefile's .PHONY, each with what
// it does, and nothing else.
func TestMakeHelp(t *testing.T) {
	t.Parallel()
	cmd := testenv.Command(t, time.Minute, "make", "-s", "--no-print-directory", "-C", "../..", "help")
	// A make that runs this test must not lend it its jobserver or flags.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, stderr.String())
	}
	targets := makeTargets(t)
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || !slices.Contains(targets, fields[0]) || listed[fields[0]] {
			t.Errorf("make help: %q is not one line of a .PHONY target and what it does", line)
			continue
		}
		listed[fields[0]] = true
	}
	for _, target := range targets {
		if !listed[target] {
			t.Errorf("make help does not list %s (give its rule a `## what it does` comment)", target)
		}
	}
}
