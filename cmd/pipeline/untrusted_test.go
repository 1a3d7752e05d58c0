package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pycall"
)

// hostileID is a checkpoint id that, taken for a path under a staging directory
// (dir/a/b/OUT.staging-X), names dir/a/escaped.
const hostileID = "../../escaped"

// TestHostileCheckpointID: an output whose manifest carries the id ../../escaped (its dir a
// plain name, so every path check passes) is refused, naming the id, by merge (which once
// wrote dir/a/escaped as root, outside its output), by a pull of its image, and by smoke;
// nothing is written outside the output.
func TestHostileCheckpointID(t *testing.T) {
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	// The image of the good output, its last layer (manifest.json's) replaced below.
	img, _, err := output.Image(out, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	m := testenv.Manifest(t, out)
	m.Checkpoints[0].ID = hostileID
	if err := atomicfile.WriteJSON(filepath.Join(out, manifest.FileName), m); err != nil {
		t.Fatal(err)
	}
	// The catalogue is checked on its own: without it only the manifest speaks of ids.
	if err := os.Remove(filepath.Join(out, "catalogue.json")); err != nil {
		t.Fatal(err)
	}
	escaped := filepath.Join(dir, "a", "escaped")
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}

	merged := filepath.Join(dir, "a", "b", "merged")
	code, _, stderr := runCLI(t, "merge", "--config", cfg, "--out", merged, out)
	if code == exitOK || !strings.Contains(stderr, `"`+hostileID+`"`) {
		t.Errorf("merge of an output with the id %s: exit %d\n%s", hostileID, code, stderr)
	}
	if _, err := os.Lstat(escaped); !os.IsNotExist(err) {
		t.Errorf("merge wrote %s, outside its output (%v)", escaped, err)
		os.RemoveAll(escaped)
	}
	if _, err := os.Lstat(merged); !os.IsNotExist(err) {
		t.Errorf("a refused merge wrote its output (%v)", err)
	}

	// The same manifest in an image, pulled.
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(filepath.Join(out, m.Spec))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	top := tarLayer(t, tar.Header{Name: output.Root + "/", Typeflag: tar.TypeDir, Mode: 0o755},
		file(output.Root+"/"+manifest.FileName, string(data)), file(output.Root+"/"+m.Spec, string(spec)))
	forged, err := mutate.AppendLayers(empty.Image, append(layers[:len(layers)-1], top)...)
	if err != nil {
		t.Fatal(err)
	}
	im, _ := img.Manifest()
	forged = mutate.Annotations(forged, im.Annotations).(v1.Image)
	ref := writeLayout(t, filepath.Join(dir, "layout"), forged)
	pullRefused(t, cfg, ref, filepath.Join(dir, "a", "b", "pulled"), `"`+hostileID+`"`)
	if _, err := os.Lstat(escaped); !os.IsNotExist(err) {
		t.Errorf("pull wrote %s, outside its output (%v)", escaped, err)
	}

	if code, _, stderr := runCLI(t, "smoke", "--config", cfg, "--out", out); code == exitOK || !strings.Contains(stderr, `"`+hostileID+`"`) {
		t.Errorf("smoke of an output with the id %s: exit %d\n%s", hostileID, code, stderr)
	}
}

// TestKilledWriterTemporaries: the temporary files a writer killed between its create and
// its rename leaves in an output (measure's, analyze's) neither block a capture (CheckOutput
// once refused the output for good) nor outlive the next writer: capture and measure each
// succeed and remove them.
func TestKilledWriterTemporaries(t *testing.T) {
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	plant := func() []string {
		var paths []string
		for _, name := range []string{".manifest.json.tmp-4242", ".analysis.json.tmp-17", filepath.Join("js", ".meta.json.tmp-9")} {
			path := filepath.Join(out, name)
			if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, path)
		}
		return paths
	}
	for _, args := range [][]string{{"capture", "--config", cfg}, {"measure", "--config", cfg}} {
		left := plant()
		if code, _, stderr := runCLI(t, args...); code != exitOK {
			t.Fatalf("%s over an output with a killed writer's temporary files: exit %d\n%s", args[0], code, stderr)
		}
		for _, path := range left {
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("%s left %s (%v)", args[0], path, err)
			}
		}
	}
}

// TestPassEnvOnlyWhenAsked: the config's pass_env values reach a sandbox restored from an
// existing output (any output: a pulled one is a stranger's) only with --pass-env. A variable
// named by pass_env and set in the pipeline's environment is read by a call in the restored
// executor: empty without it, its value with it; smoke and measure say which in their log.
func TestPassEnvOnlyWhenAsked(t *testing.T) {
	const name, value = "READIE_PASS_CANARY", "canary-7d1f"
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(data, "pass_env: ["+name+"]\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(name, value)
	out := filepath.Join(dir, "out")

	seen := func(passEnv bool) string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		env := testRunEnv(ctx, t, cfg)
		env.PassEnvToOutputs = passEnv
		request, _ := pycall.EvalRequest(`__import__("os").environ.get("` + name + `", "")`)
		var got any
		_, err := env.WithVerifiedOutput(ctx, out, []string{"js"}, func(x *run.VerifiedOutput) error {
			r := x.Sandboxes.Restorer(x.Work, time.Minute)
			_, err := r.TimedCall(ctx, launch.Call{SetID: "js", Step: "call", Image: launch.Image{Dir: x.Dir(x.Picked[0]), Flags: r.Flags}, Request: request,
				Check: func(resp []byte) error {
					var err error
					got, err = pycall.DecodeEnvelope(resp)
					return err
				}})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := got.(string)
		return s
	}
	if got := seen(false); got != "" {
		t.Errorf("without --pass-env the restored executor saw %s=%q", name, got)
	}
	if got := seen(true); got != value {
		t.Errorf("with --pass-env the restored executor saw %s=%q, want %q", name, got, value)
	}

	const said = "pass_env: not passed into the sandboxes of an existing output"
	for _, args := range [][]string{{"smoke"}, {"measure", "--runs", "1"}} {
		args = append(args, "--config", cfg)
		if code, _, stderr := runCLI(t, args...); code != exitOK || !strings.Contains(stderr, said) {
			t.Errorf("%v: exit %d, want the log to say %q\n%s", args, code, said, stderr)
		}
		if code, _, stderr := runCLI(t, append(args, "--pass-env")...); code != exitOK || strings.Contains(stderr, said) {
			t.Errorf("%v --pass-env: exit %d\n%s", args, code, stderr)
		}
	}
}

// TestAnalyzeOffline: analyze imports an image's modules with no network even when the
// config's runsc.network is sandbox: every measurement it caches was made with runsc
// --network=none (the cache key records the flags its sandboxes ran with), and analysis.json
// is written.
func TestAnalyzeOffline(t *testing.T) {
	dir := testenv.WorkDir(t)
	cfg := catalogueConfig(t, dir)
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(data), "runsc:\n", "runsc:\n  network: sandbox\n", 1)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	corpusPath := filepath.Join(dir, "corpus.jsonl")
	if err := os.WriteFile(corpusPath, []byte(`{"imports": ["json"]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := runCLI(t, "analyze", "--config", cfg, "--corpus", corpusPath); code != exitOK {
		t.Fatalf("analyze: exit %d\n%s%s", code, stdout, stderr)
	}
	var entries int
	err = filepath.WalkDir(filepath.Join(dir, "analysis-cache"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var e struct {
			Key struct {
				Kind       string   `json:"kind"`
				RunscFlags []string `json:"runsc_flags"`
			} `json:"key"`
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &e); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		entries++
		if !slices.Contains(e.Key.RunscFlags, "--network=none") {
			t.Errorf("%s (%s) was measured with runsc flags %v, not --network=none", path, e.Key.Kind, e.Key.RunscFlags)
		}
		return nil
	})
	if err != nil || entries == 0 {
		t.Fatalf("%d cache entries: %v", entries, err)
	}
}

// TestPrecompileBounded: the precompile runs an image's own python3 with nothing of the host
// writable (it once had a host directory, unbounded) and what it prints is bounded by
// limits.sandbox_output: an image whose python3, asked to precompile, tries to write 100 MiB
// into the bytecode directory it is given and prints 100 MiB is refused, naming the limit,
// and no output is written.
func TestPrecompileBounded(t *testing.T) {
	base := userImage(t) // before XDG_CACHE_HOME moves: its base layer is cached
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := testenv.WorkDir(t)
	script := "#!/bin/sh\ncase \"$2\" in *compileall*)\n" +
		"  mkdir -p \"$PYTHONPYCACHEPREFIX\"; head -c 104857600 /dev/zero > \"$PYTHONPYCACHEPREFIX/flood\"\n" +
		"  head -c 104857600 /dev/zero; exit 0;;\nesac\nexec /usr/bin/python3.11 \"$@\"\n"
	top := tarLayer(t, tar.Header{Name: "usr/bin/python3", Linkname: script, Mode: 0o755})
	img, err := mutate.AppendLayers(base, top)
	if err != nil {
		t.Fatal(err)
	}
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: small\n    imports: [json]\n"}.write(t)
	code, _, stderr := runCLI(t, "capture", "--config", cfg, "--image", ref)
	if code == exitOK || !strings.Contains(stderr, "precompile") || !strings.Contains(stderr, "more on its stdout than limits.sandbox_output keeps") {
		t.Fatalf("capture of an image whose precompile floods: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Error("the output was written")
	}
}
