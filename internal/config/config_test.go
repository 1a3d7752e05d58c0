package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	pipeline "readie.dev/pipeline"
)

func TestDefaultConfig(t *testing.T) {
	c, err := Parse(pipeline.DefaultConfig(), "default", "/repo", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	if c.Runsc.Path != "/cache/readie/runsc/readie-20260905-160fafc42237/runsc" {
		t.Errorf("runsc path %q", c.Runsc.Path)
	}
	if c.Rootfs != "/cache/readie/rootfs/default" || c.Output != "/repo/out" || c.Runsc.Network != "none" {
		t.Errorf("config %+v", c)
	}
	if c.Timeouts.Capture != 5*time.Minute || c.RestoreRuns != 5 || c.Timeouts.ImageProbe != 2*time.Minute {
		t.Errorf("timeouts %+v runs %d", c.Timeouts, c.RestoreRuns)
	}
	if c.Limits != (Limits{ImageBytes: 64 << 30, ImageEntries: 1_000_000, ImageFileBytes: 16 << 30, SandboxOutput: 16 << 20, SandboxMemory: 4 << 30}) {
		t.Errorf("limits %+v", c.Limits)
	}
	sel, err := c.Select(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range sel.Sets {
		ids = append(ids, s.ID)
	}
	if strings.Join(ids, ",") != "empty,numpy,pandas" || sel.Picked != nil || !sel.Picks("numpy") {
		t.Errorf("sets %v, picked %v", ids, sel.Picked)
	}
	if c.CheckpointCache != "/cache/readie/checkpoints" {
		t.Errorf("checkpoint_cache %q", c.CheckpointCache)
	}
}

func TestSelect(t *testing.T) {
	c, err := Parse(pipeline.DefaultConfig(), "default", "/repo", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	sel, err := c.Select([]string{"pandas"}, nil)
	if err != nil || len(sel.Sets) != 3 || !sel.Picks("pandas") || !sel.Picks(EmptySetID) || sel.Picks("numpy") {
		t.Errorf("--only pandas: %+v %v", sel, err)
	}
	if _, err := c.Select([]string{"nope"}, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("--only nope: %v", err)
	}
	torch, err := ParseSet("torch=torch, numpy")
	if err != nil || torch.ID != "torch" || strings.Join(torch.Imports, ",") != "torch,numpy" {
		t.Fatalf("ParseSet = %+v, %v", torch, err)
	}
	numpy2, _ := ParseSet("numpy=numpy,json")
	sel, err = c.Select(nil, []PackageSet{torch, numpy2})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sel.Sets {
		got = append(got, s.ID+"="+strings.Join(s.Imports, ","))
	}
	if strings.Join(got, " ") != "empty= numpy=numpy,json pandas=pandas torch=torch,numpy" {
		t.Errorf("--set: %v", got)
	}
	if !sel.Picks("torch") || !sel.Picks("numpy") || sel.Picks("pandas") {
		t.Errorf("--set picks %v", sel.Picked)
	}
	if sel, err := c.Select([]string{"torch"}, []PackageSet{torch}); err != nil || !sel.Picks("torch") {
		t.Errorf("--only naming a --set id: %v", err)
	}
	for _, bad := range []string{"torch", "=numpy", "empty=json", "a/b=json", "torch=", "torch=scikit-learn", "torch=os;rm"} {
		if _, err := ParseSet(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseSet(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// The Makefile installs runsc under the label the default config points at.
func TestRunscLabelMatchesMakefile(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(pipeline.DefaultConfig(), "default", "/repo", "/cache")
	if err != nil {
		t.Fatal(err)
	}
	label := filepath.Base(filepath.Dir(c.Runsc.Path))
	if !strings.Contains(string(makefile), "RUNSC_LABEL := "+label+"\n") {
		t.Fatalf("Makefile's RUNSC_LABEL differs from the default config's runsc path label %q", label)
	}
}

// lineOf is the 1-based line of text that holds part.
func lineOf(text, part string) int {
	return strings.Count(text[:strings.Index(text, part)], "\n") + 1
}

func TestSizes(t *testing.T) {
	for text, want := range map[string]Size{"4096": 4096, "512MiB": 512 << 20, "1 KiB": 1 << 10, "2TiB": 2 << 40, "7B": 7} {
		c, err := Parse([]byte("limits:\n  image_file_bytes: "+text+"\n"), "test.yaml", "/repo", "/cache")
		if err != nil || c.Limits.ImageFileBytes != want {
			t.Errorf("%q: %v %v, want %d", text, c.Limits.ImageFileBytes, err, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	valid := string(pipeline.DefaultConfig())
	replace := func(old, new string) string {
		if !strings.Contains(valid, old) {
			t.Fatalf("default config lacks %q", old)
		}
		return strings.Replace(valid, old, new, 1)
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"syntax error with line", replace("restore_runs: 5", "restore_runs: [5"), "line"},
		{"unknown key", replace("restore_runs: 5", "restore_runs: 5\nrestore_rnus: 3"), "restore_rnus"},
		{"duplicate id", replace("id: pandas", "id: numpy"), `duplicate id "numpy"`},
		{"id with slash", replace("id: pandas", "id: ../pandas"), `id "../pandas"`},
		{"id with dots", replace("id: pandas", "id: .."), `id ".."`},
		{"reserved id", replace("id: pandas", "id: empty"), "reserved"},
		{"bad import", replace("imports: [pandas]", "imports: [\"pandas; rm -rf /\"]"), "not a dotted Python module name"},
		{"import with dash", replace("imports: [pandas]", "imports: [scikit-learn]"), "scikit-learn"},
		{"empty imports", replace("imports: [pandas]", "imports: []"), "imports is empty"},
		{"no sets", strings.Split(valid, "checkpoints:")[0] + "checkpoints: []\n", "no package set"},
		{"zero runs", replace("restore_runs: 5", "restore_runs: 0"), "restore_runs"},
		{"bad timeout", replace("capture: 5m", "capture: soon"), fmt.Sprintf(`line %d: timeouts.capture: "soon" is not a duration: want one such as 5m or 90s`, lineOf(valid, "capture: 5m"))},
		{"timeout as a number", replace("capture: 5m", "capture: 5"), `timeouts.capture: "5" is not a duration`},
		{"misspelt key", replace("restore_runs: 5", "restore_run: 5"), fmt.Sprintf("line %d: unknown key restore_run (did you mean restore_runs?)", lineOf(valid, "restore_runs: 5"))},
		{"misspelt nested key", replace("host_uds: create", "hostuds: create"), "unknown key runsc.hostuds (did you mean runsc.host_uds?)"},
		{"runs not a number", replace("restore_runs: 5", "restore_runs: five"), `restore_runs: "five" is not a whole number`},
		{"imports not a list", replace("imports: [pandas]", "imports: pandas"), "checkpoints[1].imports: want a list"},
		{"negative timeout", replace("smoke: 2m", "smoke: -1s"), "timeouts.smoke"},
		{"bad network", replace("network: none", "network: wifi"), "runsc.network"},
		{"host uds off", replace("host_uds: create", "host_uds: none"), "host_uds"},
		{"host network", replace("network: none", "network: host"), "runsc.network \"host\": --network takes one of none, sandbox"},
		{"a restore flag runsc takes as a path", replace(`restore_flags: []`, `restore_flags: ["-pid-file=/etc/x"]`), "is not one of -background, -direct"},
		{"a global flag outside the list", replace("  host_uds: create\n", "  host_uds: create\n  global_flags: [\"--log=/etc/x\"]\n"), "runsc.global_flags: runsc flag \"--log=/etc/x\" is not one of"},
		{"restore flag", replace(`restore_flags: []`, `restore_flags: ["direct"]`), "not a flag"},
		{"size without a number", replace("image_bytes: 64GiB", "image_bytes: lots"), fmt.Sprintf("line %d: \"lots\" is not a size", lineOf(valid, "image_bytes: 64GiB"))},
		{"size in decimal units", replace("image_bytes: 64GiB", "image_bytes: 64GB"), `"64GB" is not a size`},
		{"size too large", replace("image_bytes: 64GiB", "image_bytes: 99999999TiB"), "too large"},
		{"zero limit", replace("image_entries: 1000000", "image_entries: 0"), "limits.image_entries"},
		{"sandbox memory below a sandbox's floor", replace("sandbox_memory: 4GiB", "sandbox_memory: 1MiB"), "limits.sandbox_memory 1MiB: want at least 32MiB"},
		{"no sandbox memory limit", replace("sandbox_memory: 4GiB", "sandbox_memory: 0"), "limits.sandbox_memory 0: want at least 32MiB"},
		{"zero probe timeout", replace("image_probe: 2m", "image_probe: 0s"), "timeouts.image_probe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "test.yaml", "/repo", "/cache")
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "test.yaml") {
				t.Fatalf("error %q does not name %q and the file", err, tt.want)
			}
		})
	}
}

func TestCacheDir(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if got := CacheDir(); got != "/xdg/readie" {
		t.Errorf("CacheDir = %q", got)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got := CacheDir(); got != "/home/u/.cache/readie" {
		t.Errorf("CacheDir = %q", got)
	}
}

// TestOnlyCheckpoints: a config that names nothing but its package sets takes every other key
// from the documented defaults.
func TestOnlyCheckpoints(t *testing.T) {
	c, err := Parse([]byte("checkpoints:\n  - id: torch\n    imports: [json]\n"), "mine.yaml", "/work", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	def, err := Parse(pipeline.DefaultConfig(), "default", "/work", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Checkpoints) != 1 || c.Checkpoints[0].ID != "torch" {
		t.Fatalf("checkpoints %+v: the config's list must replace the default's", c.Checkpoints)
	}
	c.Checkpoints = def.Checkpoints
	if !reflect.DeepEqual(c, def) {
		t.Fatalf("a config of only checkpoints:\n%+v\nthe defaults:\n%+v", c, def)
	}
	// The default rootfs is the one `make image` built, known to the cache, wherever the
	// config is.
	if c.Rootfs != "/cache/readie/rootfs/default" {
		t.Errorf("rootfs %s: want the cache's default rootfs", c.Rootfs)
	}
	if c.Runsc.Path != "/cache/readie/runsc/readie-20260905-160fafc42237/runsc" || c.RestoreRuns != 5 || c.Timeouts.Capture != 5*time.Minute {
		t.Errorf("defaults: %+v", c)
	}
	// A key it does give wins; a map it gives is its own.
	c, err = Parse([]byte("restore_runs: 9\nrunsc:\n  checkpoint_options: {compression: none}\n"), "mine.yaml", "/work", "/cache")
	if err != nil || c.RestoreRuns != 9 || c.Runsc.Network != "none" || c.Runsc.CheckpointOptions["compression"] != "none" {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := Parse(nil, "empty.yaml", "/work", "/cache"); err != nil {
		t.Errorf("an empty config file: %v", err)
	}
}

// TestDefaultsFile: the file $READIE_DEFAULTS names (the pipeline's image says where its runsc
// and rootfs are) lies between the embedded defaults and the config; a config's own key still
// wins, and a missing or bad file is a config error naming the variable.
func TestDefaultsFile(t *testing.T) {
	dir := t.TempDir()
	defaults := filepath.Join(dir, "defaults.yaml")
	os.WriteFile(defaults, []byte("runsc:\n  path: /usr/local/bin/runsc\nrootfs: /usr/share/readie/rootfs\n"), 0o644)
	t.Setenv(DefaultsEnv, defaults)
	c, err := Parse([]byte("checkpoints:\n  - id: j\n    imports: [json]\n"), "mine.yaml", "/work", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	if c.Runsc.Path != "/usr/local/bin/runsc" || c.Rootfs != "/usr/share/readie/rootfs" {
		t.Errorf("runsc %s, rootfs %s: want the defaults file's", c.Runsc.Path, c.Rootfs)
	}
	if c.Runsc.Root != "/run/readie/runsc" || c.CheckpointCache != "/cache/readie/checkpoints" || c.Checkpoints[0].ID != "j" {
		t.Errorf("the embedded defaults and the config's own keys: %+v", c)
	}
	c, err = Parse([]byte("runsc:\n  path: /opt/runsc\n"), "mine.yaml", "/work", "/cache/readie")
	if err != nil || c.Runsc.Path != "/opt/runsc" || c.Rootfs != "/usr/share/readie/rootfs" {
		t.Errorf("a config's runsc.path: %+v %v", c, err)
	}
	os.WriteFile(defaults, []byte("runsc:\n  pth: /x\n"), 0o644)
	for _, path := range []string{defaults, filepath.Join(dir, "missing.yaml")} {
		t.Setenv(DefaultsEnv, path)
		_, err := Parse(nil, "mine.yaml", "/work", "/cache")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), DefaultsEnv+"="+path) {
			t.Errorf("defaults %s: %v, want a config error naming %s", path, err, DefaultsEnv)
		}
	}
}

// TestShards: every set in exactly one shard, a set's shard independent of the other sets,
// and "empty" in every shard.
func TestShards(t *testing.T) {
	ids := []string{"json", "csv", "sqlite3", "email", "numpy", "pandas", "torch", "scipy"}
	var sets []PackageSet
	for _, id := range ids {
		sets = append(sets, PackageSet{ID: id, Imports: []string{id}})
	}
	if _, err := Parse([]byte("checkpoints: []\n"), "x", "/w", "/c"); err == nil {
		t.Fatal("an empty checkpoints list was accepted")
	}
	c, _ := Parse(pipeline.DefaultConfig(), "x", "/w", "/c")
	c.Checkpoints = sets
	seen := map[string]int{}
	for i := range 3 {
		sel, _ := c.Select(nil, nil)
		sel.Shard(i, 3)
		if sel.Sets[0].ID != EmptySetID {
			t.Errorf("shard %d lacks empty", i)
		}
		for _, s := range sel.Sets[1:] {
			seen[s.ID]++
			if ShardOf(s.ID, 3) != i {
				t.Errorf("%s in shard %d", s.ID, i)
			}
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("%s is in %d shards", id, seen[id])
		}
	}
	// Stable: removing or adding other sets moves nobody.
	before := ShardOf("numpy", 3)
	c.Checkpoints = sets[4:5]
	sel, _ := c.Select(nil, nil)
	sel.Shard(before, 3)
	if len(sel.Sets) != 2 || sel.Sets[1].ID != "numpy" {
		t.Errorf("numpy alone: %v", sel.Sets)
	}
	for _, bad := range []string{"3/3", "-1/3", "1", "a/3", "0/0", "1/b"} {
		if _, _, err := ParseShard(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseShard(%q) = %v", bad, err)
		}
	}
	if i, n, err := ParseShard("2/5"); i != 2 || n != 5 || err != nil {
		t.Errorf("ParseShard(2/5) = %d %d %v", i, n, err)
	}
}

func TestBenchVariants(t *testing.T) {
	c, err := Parse(pipeline.DefaultConfig(), "default", "/w", "/c")
	if err != nil || len(c.Bench.Variants) != 9 || c.Bench.Variants[4].CheckpointOptions["exclude-committed-zero-pages"] != "true" || c.Bench.Variants[7].PageCache != "cold" {
		t.Fatalf("default variants %+v %v", c.Bench.Variants, err)
	}
	for bad, want := range map[string]string{
		"bench:\n  variants:\n    - {name: a b}\n":                               "name",
		"bench:\n  variants:\n    - {name: a}\n    - {name: a}\n":                "duplicate name",
		"bench:\n  variants:\n    - {name: a, restore_flags: [direct]}\n":        "not a flag",
		"bench:\n  variants:\n    - {name: a, checkpoint_options: {bogus: x}}\n": "bogus",
		"bench:\n  variants:\n    - {name: a/b}\n":                               "name",
		"bench:\n  variants:\n    - {name: a, page_cache: lukewarm}\n":           "page_cache \"lukewarm\": want warm or cold",
		// The boot knobs: a global flag outside the kit's list, or with a value that writes the
		// host's settings, is named; so is a flag the runsc section sets, and an unknown step.
		"bench:\n  variants:\n    - {name: a, global_flags: [--systemd-cgroup]}\n":         `bench.variants[0] (a).global_flags: runsc flag "--systemd-cgroup" is not one of`,
		"bench:\n  variants:\n    - {name: a, global_flags: [--host-settings=adjust]}\n":   `runsc flag "--host-settings=adjust": --host-settings takes one of ["ignore" "check"]`,
		"bench:\n  variants:\n    - {name: a, global_flags: [--network=host]}\n":           `set "--network=host" with its own key`,
		"bench:\n  variants:\n    - {name: a, pre_checkpoint: [gc.collect, gc.compact]}\n": `bench.variants[0] (a).pre_checkpoint: "gc.compact" is not one of gc.collect, gc.freeze, malloc_trim`,
		"bench:\n  variants:\n    - {name: a, pooled: true, page_cache: cold}\n":           "pooled with page_cache cold",
		"bench:\n  variants:\n    - {name: a, pre_checkpoint: gc.collect}\n":               "want a list",
	} {
		if _, err := Parse([]byte(bad), "x.yaml", "/w", "/c"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", bad, err, want)
		}
	}
}

// TestBenchVariantKnobs: a variant's global flags, pre-checkpoint steps, pool and helpers are
// read as written, and the steps the config accepts are exactly the executor's.
func TestBenchVariantKnobs(t *testing.T) {
	c, err := Parse([]byte("bench:\n  variants:\n    - {name: a, global_flags: [--host-settings=ignore, --ignore-cgroups, --app-huge-pages=false], pre_checkpoint: [gc.collect, malloc_trim], pooled: true, without_helpers: true}\n    - {name: b}\n"), "x.yaml", "/w", "/c")
	if err != nil {
		t.Fatal(err)
	}
	v := c.Bench.Variants[0]
	if strings.Join(v.GlobalFlags, " ") != "--host-settings=ignore --ignore-cgroups --app-huge-pages=false" || strings.Join(v.PreCheckpoint, " ") != "gc.collect malloc_trim" || !v.Pooled || !v.WithoutHelpers {
		t.Errorf("variant %+v", v)
	}
	if c.Bench.Variants[1].WithoutHelpers {
		t.Errorf("a variant that does not say without_helpers: %+v", c.Bench.Variants[1])
	}
	source, err := os.ReadFile("../../images/executor/readie_executor/precheckpoint.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^STEPS = \{(.*)\}$`).FindSubmatch(source)
	if m == nil {
		t.Fatal("no STEPS in precheckpoint.py")
	}
	var python []string
	for _, k := range regexp.MustCompile(`"([^"]+)":`).FindAllSubmatch(m[1], -1) {
		python = append(python, string(k[1]))
	}
	if !slices.Equal(python, PreCheckpointSteps()) {
		t.Errorf("the executor's steps %q, the config's %q", python, PreCheckpointSteps())
	}
}

// TestCPUBaseline: the list form, the mapping with features or a file of host types (their
// intersection, relative to the config), enforce's default, and every bad form named.
func TestCPUBaseline(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hosts.txt"), []byte("# type a\nfpu,sse2,avx2,avx512f\nclflush size : 64\n# type b\nsse2,fpu,avx2\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.txt"), []byte("fpu,sse2\nfpu,AVX2\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "disjoint.txt"), []byte("fpu\nsse2\n"), 0o644)
	sets := "checkpoints:\n  - id: a\n    imports: [json]\n"
	parse := func(text string) (*Config, error) {
		return Parse([]byte(sets+text), "test.yaml", dir, "/cache")
	}
	c, err := parse("cpu_baseline: [sse2, fpu, avx2, fpu]\n")
	if err != nil {
		t.Fatal(err)
	}
	if b := c.CPUBaseline; strings.Join(b.Features, ",") != "avx2,fpu,sse2" || !b.Enforced() || b.Hosts != nil {
		t.Errorf("list form: %+v", b)
	}
	c, err = parse("cpu_baseline:\n  file: hosts.txt\n  enforce: false\n")
	if err != nil {
		t.Fatal(err)
	}
	if b := c.CPUBaseline; strings.Join(b.Features, ",") != "avx2,fpu,sse2" || b.Enforced() || len(b.Hosts) != 2 || b.Hosts[0].CacheLine != 64 || b.File != filepath.Join(dir, "hosts.txt") {
		t.Errorf("file form: %+v", b)
	}
	c, err = parse("cpu_baseline: {features: [fpu], enforce: true}\n")
	if err != nil || strings.Join(c.CPUBaseline.Features, ",") != "fpu" || !c.CPUBaseline.Enforced() {
		t.Errorf("mapping with features: %+v %v", c.CPUBaseline, err)
	}
	if c, err := parse(""); err != nil || c.CPUBaseline != nil {
		t.Errorf("no baseline: %+v %v", c, err)
	}
	for _, tt := range []struct{ name, yaml, want string }{
		{"unknown names", "cpu_baseline: [fpu, avx512ifma, AVX2]\n", "cpu_baseline: names gVisor does not know: AVX2, avx512ifma"},
		{"unknown names in a file", "cpu_baseline: {file: bad.txt}\n", "bad.txt: line 2: names gVisor does not know: AVX2"},
		{"missing file", "cpu_baseline: {file: nope.txt}\n", "nope.txt"},
		{"nothing in common", "cpu_baseline: {file: disjoint.txt}\n", "have no feature in common"},
		{"both", "cpu_baseline: {file: hosts.txt, features: [fpu]}\n", "features or file, not both"},
		{"empty list", "cpu_baseline: []\n", "list feature names"},
		{"unknown key", "cpu_baseline: {file: hosts.txt, enforced: false}\n", "unknown key cpu_baseline.enforced (did you mean cpu_baseline.enforce?)"},
		{"not a bool", "cpu_baseline: {file: hosts.txt, enforce: maybe}\n", `cpu_baseline.enforce: "maybe" is not true or false`},
		{"a scalar", "cpu_baseline: fpu\n", "cpu_baseline: want a list"},
		{"a control in pass_env", "pass_env: [GLIBC_TUNABLES]\ncpu_baseline: [fpu]\n", "pass_env: GLIBC_TUNABLES is set by cpu_baseline's library controls"},
		{"the pipeline's own variable in pass_env", "pass_env: [READIE_PRE_CHECKPOINT]\n", "pass_env: READIE_PRE_CHECKPOINT is the pipeline's own"},
		{"the executor's mode in pass_env", "pass_env: [EXECUTOR_MODE]\n", "pass_env: EXECUTOR_MODE is the pipeline's own"},
		{"the set in pass_env", "pass_env: [READIE_PREIMPORT]\n", "pass_env: READIE_PREIMPORT is the pipeline's own"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(tt.yaml)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "test.yaml") {
				t.Errorf("error %v, want ErrInvalid naming test.yaml and %q", err, tt.want)
			}
		})
	}
}

// TestBenchConfigs: every config of bench/ (the bench-* targets') loads.
func TestBenchConfigs(t *testing.T) {
	paths, err := filepath.Glob("../../bench/*.yaml")
	if err != nil || len(paths) < 6 {
		t.Fatalf("bench/*.yaml: %v, %v", paths, err)
	}
	for _, path := range paths {
		if _, err := Load(path, "/cache"); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}
