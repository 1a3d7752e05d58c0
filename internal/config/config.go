// Package config reads and validates pipeline.yaml.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	pipeline "readie.dev/pipeline"
	"readie.dev/pipeline/pkg/bytesize"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/sandbox"
)

// EmptySetID is the package set with no imports that every run captures first.
const EmptySetID = checkpointid.Empty

// ErrInvalid wraps every config problem, and every bad value of a flag that config parses
// (--set, --shard).
var ErrInvalid = errors.New("invalid config")

// flagValueError is a bad flag value: it matches ErrInvalid but reads as its own message, since
// "invalid config" would mislead about a flag.
type flagValueError struct{ error }

func (flagValueError) Is(target error) bool { return target == ErrInvalid }

// PackageSet is one package set: a checkpoint with these modules pre-imported.
type PackageSet struct {
	ID      string   `yaml:"id"`
	Imports []string `yaml:"imports"`
}

// Runsc configures the runsc binary and its global flags.
type Runsc struct {
	Path         string   `yaml:"path"`
	Root         string   `yaml:"root"`
	Network      string   `yaml:"network"`
	Overlay      string   `yaml:"overlay"`
	HostUDS      string   `yaml:"host_uds"`
	RestoreFlags []string `yaml:"restore_flags"`
	// GlobalFlags are further runsc global flags for every command, e.g. --ignore-cgroups.
	GlobalFlags []string `yaml:"global_flags"`
	// CheckpointOptions are extra gVisor checkpoint annotations for captures, named without
	// the "dev.gvisor.internal.checkpoint." prefix.
	CheckpointOptions map[string]string `yaml:"checkpoint_options"`
}

// SandboxFlags returns the runsc global flags this section gives every sandbox, typed: the one
// place they are made from the config.
func (r Runsc) SandboxFlags() sandbox.Flags {
	return sandbox.Flags{Network: r.Network, Overlay: r.Overlay, HostUDS: r.HostUDS, Extra: slices.Clone(r.GlobalFlags)}
}

// BenchVariant is a restore variant `pipeline bench` measures beside the core series: restore
// flags, and checkpoint options for an image captured for it alone.
type BenchVariant struct {
	Name              string            `yaml:"name"`
	RestoreFlags      []string          `yaml:"restore_flags"`
	CheckpointOptions map[string]string `yaml:"checkpoint_options"`
	// PageCache is "warm" (the default: an image restored many times) or "cold": the image's
	// files are evicted from the page cache before each restore, as for the first restore
	// after a pull.
	PageCache string `yaml:"page_cache"`
	// GlobalFlags are further runsc global flags for this variant's sandboxes (its capture,
	// its restores, its pool's creates), e.g. --host-settings=ignore: the same allow-list as
	// runsc.global_flags. With any, the variant gets an image captured for it alone.
	GlobalFlags []string `yaml:"global_flags"`
	// PreCheckpoint are steps the executor runs after its imports, just before the checkpoint
	// (PreCheckpointSteps), in order. With any, the variant gets an image captured for it alone.
	PreCheckpoint []string `yaml:"pre_checkpoint"`
	// Pooled restores from a pool of sandboxes created ahead with the variant's global flags,
	// timed from Get to the answer, as the pooled series is.
	Pooled bool `yaml:"pooled"`
	// WithoutHelpers boots the variant's sandboxes without runsc's helpers (gvisor-bin/): runsc
	// itself as the sentry and no prewarmer, as before gVisor shipped them (docs/knobs.md). It
	// restores the output's own image.
	WithoutHelpers bool `yaml:"without_helpers"`
}

// PreCheckpointSteps are the executor's optional steps before a checkpoint
// (images/executor/readie_executor/precheckpoint.py): a bench variant's pre_checkpoint.
func PreCheckpointSteps() []string { return []string{"gc.collect", "gc.freeze", "malloc_trim"} }

// Bench configures `pipeline bench`.
type Bench struct {
	Variants []BenchVariant `yaml:"variants"`
	// Concurrency is how many restores at once the workers run: the manifest's restore flags
	// are the fastest at it. 0 before defaults: the number of CPUs.
	Concurrency int `yaml:"concurrency"`
}

// Sandbox shapes every capture's sandbox beyond runsc's flags.
type Sandbox struct {
	// CPUs is how many CPUs a capture's sandbox sees: a checkpoint keeps the count (gVisor
	// saves it and a restore cannot change it), and libraries size themselves by it at import
	// (OpenBLAS starts a thread per CPU), so it is pinned, the same on every build host.
	CPUs int `yaml:"cpus"`
}

// Analysis configures `pipeline analyze`: how import costs are measured in sandboxes of the image.
type Analysis struct {
	// Runs is how many fresh sandboxes each timed import is the median of.
	Runs int `yaml:"runs"`
	// Timeout bounds one analysis sandbox (a cold start and its import, or the name probe).
	Timeout time.Duration `yaml:"timeout"`
	// Cache holds the measurements by a digest of what they depend on, shared by every run.
	Cache string `yaml:"cache"`
}

// Timeouts bound every wait on something outside the process.
type Timeouts struct {
	Capture      time.Duration `yaml:"capture"`
	Restore      time.Duration `yaml:"restore"`
	Smoke        time.Duration `yaml:"smoke"`
	RunscCommand time.Duration `yaml:"runsc_command"`
	// Registry bounds one push or pull, retries included, and the fetch and unpack of an
	// --image.
	Registry time.Duration `yaml:"registry"`
	// ImageProbe bounds each run of an image's own code while its rootfs is made (the python3
	// probe, the precompile of the executor), each in a sandbox.
	ImageProbe time.Duration `yaml:"image_probe"`
}

// Limits bound what unpacking an image (--image) or pulling an output may write (a small layer
// can claim any size: a sparse entry, gzip of zeros), and what a sandbox's output may take.
type Limits struct {
	// ImageBytes bounds all entries' data together, at its declared (expanded) size.
	ImageBytes Size `yaml:"image_bytes"`
	// ImageEntries bounds the tar entries of all layers.
	ImageEntries int64 `yaml:"image_entries"`
	// ImageFileBytes bounds one entry's data, at its declared (expanded) size, whatever its type.
	ImageFileBytes Size `yaml:"image_file_bytes"`
	// SandboxOutput bounds each of a sandbox's stdout and stderr, on disk and in the pipeline's
	// memory: the first and last halves are kept, what falls between is counted and said.
	SandboxOutput Size `yaml:"sandbox_output"`
	// SandboxMemory bounds the memory of each sandbox of the pipeline's (captures, analyze,
	// measure, smoke, bench: sandbox.Limits.Memory): a set that needs more fails naming it,
	// rather than taking the build host's memory.
	SandboxMemory Size `yaml:"sandbox_memory"`
}

// SandboxLimits are the limits of each of the pipeline's sandboxes (limits.sandbox_memory).
func (c *Config) SandboxLimits() sandbox.Limits {
	return sandbox.Limits{Memory: bytesize.Size(c.Limits.SandboxMemory)}
}

// Size is a byte count, written as an integer or with a binary unit: 512MiB, 64GiB, 2TiB
// (bytesize.Parse, which a worker's flags read too).
type Size int64

// UnmarshalYAML reads a Size.
func (s *Size) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %q is not a size (bytes, or a number with B, KiB, MiB, GiB or TiB)", node.Line, node.Value)
	}
	n, err := bytesize.Parse(node.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", node.Line, err)
	}
	*s = Size(n)
	return nil
}

// Config is pipeline.yaml.
type Config struct {
	Runsc  Runsc  `yaml:"runsc"`
	Rootfs string `yaml:"rootfs"`
	// Image, when set, is the sandbox root instead of Rootfs: an OCI image (oci-layout:DIR,
	// docker-archive:FILE or a registry reference) with the executor layered on top.
	Image string `yaml:"image"`
	// Platform is the platform chosen when Image names an image index: OS/ARCH[/VARIANT]
	// ("": the host's).
	Platform string `yaml:"platform"`
	// CheckpointCache is the content-addressed checkpoint store.
	CheckpointCache string `yaml:"checkpoint_cache"`
	Output          string `yaml:"output"`
	RestoreRuns     int    `yaml:"restore_runs"`
	// Jobs is how many sets are captured and smoke-tested at a time (0 before defaults: the
	// number of CPUs, at most 4).
	Jobs     int      `yaml:"jobs"`
	Timeouts Timeouts `yaml:"timeouts"`
	Limits   Limits   `yaml:"limits"`
	// PassEnv names variables of the pipeline's environment to pass into every sandbox. Nothing
	// else of it is passed: a checkpoint ships to every sandbox, with whatever it holds.
	PassEnv []string `yaml:"pass_env"`
	// InsecureRegistries are registry hosts spoken to over plain HTTP (localhost and
	// 127.0.0.1 always are).
	InsecureRegistries []string     `yaml:"insecure_registries"`
	Checkpoints        []PackageSet `yaml:"checkpoints"`
	Bench              Bench        `yaml:"bench"`
	// CPUBaseline, when set, is the CPU every checkpoint is captured for: the sandboxes are
	// given these features only, so the checkpoints restore on every host that has them.
	CPUBaseline *CPUBaseline `yaml:"cpu_baseline"`
	Analysis    Analysis     `yaml:"analysis"`
	Sandbox     Sandbox      `yaml:"sandbox"`
}

// CPUBaseline is cpu_baseline: a list of gVisor feature names (`cpu_baseline: [fpu, sse2,
// ...]`), or a mapping with features or file (`runsc cpu-features` outputs, one line per worker
// host type, whose intersection is the baseline) and enforce.
type CPUBaseline struct {
	Features []string `yaml:"features"`
	// File holds the host types (pkg/cpu's features file format), relative to the config.
	File string `yaml:"file"`
	// Enforce (default true) refuses a capture whose sandbox can see a feature outside the
	// baseline; false accepts one that only the library controls keep (no CPUID faulting).
	Enforce *bool `yaml:"enforce"`
	// Hosts are File's host types, read when the config is parsed.
	Hosts []cpu.Host `yaml:"-"`
}

// UnmarshalYAML takes the list form as well as the mapping.
func (b *CPUBaseline) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		return n.Decode(&b.Features)
	}
	type plain CPUBaseline // without this method
	return n.Decode((*plain)(b))
}

// Enforced reports whether the baseline must be enforced (enforce, default true).
func (b *CPUBaseline) Enforced() bool { return b.Enforce == nil || *b.Enforce }

// resolve reads File (a path already resolved) and checks the names: the baseline's features
// become the list given, or the intersection of File's host types.
func (b *CPUBaseline) resolve() error {
	switch {
	case b.File != "" && b.Features != nil:
		return errors.New("cpu_baseline: give features or file, not both")
	case b.File != "":
		hosts, err := cpu.ReadHosts(b.File)
		if err != nil {
			return fmt.Errorf("cpu_baseline.file: %w", err)
		}
		b.Hosts = hosts
		var sets [][]string
		for _, h := range hosts {
			sets = append(sets, h.Features)
		}
		b.Features = cpu.Intersect(sets...)
		if len(b.Features) == 0 {
			return fmt.Errorf("cpu_baseline.file: the host types of %s have no feature in common", b.File)
		}
	case len(b.Features) == 0:
		return errors.New("cpu_baseline: list feature names as `runsc cpu-features` prints them, or give file: a file of its outputs")
	default:
		if bad := cpu.Unknown(b.Features); len(bad) > 0 {
			return fmt.Errorf("cpu_baseline: names gVisor does not know: %s (runsc cpu-features prints the names it knows; they are case-sensitive)", strings.Join(bad, ", "))
		}
		b.Features = cpu.Normalize(b.Features)
	}
	return nil
}

var (
	variantPattern = regexp.MustCompile(`^[A-Za-z0-9_,.+=-]{1,64}$`)
	envPattern     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	modulePattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// DefaultsEnv names a file of defaults laid over the embedded ones, under every config. The
// pipeline's own image sets it to say where its runsc and rootfs are: the cache volume a pod
// mounts over {cache} hides anything the image holds there.
const DefaultsEnv = "READIE_DEFAULTS"

// Parse reads a config from data over the defaults (the embedded pipeline.yaml, then the file
// $READIE_DEFAULTS names, if any): a key the config leaves out keeps its default, a list it
// gives replaces the default's. baseDir resolves relative paths and cacheDir replaces
// "{cache}". Unknown keys, bad values and duplicate ids are errors that name the problem.
func Parse(data []byte, name, baseDir, cacheDir string) (*Config, error) {
	var c Config
	if err := decode(pipeline.DefaultConfig(), &c); err != nil {
		return nil, fmt.Errorf("%w: the embedded default config: %w", ErrInvalid, err)
	}
	if path := os.Getenv(DefaultsEnv); path != "" {
		defaults, err := os.ReadFile(path)
		if err == nil {
			err = checkKeys(defaults)
		}
		if err == nil {
			err = decode(defaults, &c)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: the defaults %s=%s names: %w", ErrInvalid, DefaultsEnv, path, err)
		}
	}
	if err := checkKeys(data); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
	}
	if err := decode(data, &c); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
	}
	resolve := func(p string) string {
		p = strings.ReplaceAll(p, "{cache}", cacheDir)
		if p != "" && !filepath.IsAbs(p) {
			p = filepath.Join(baseDir, p)
		}
		return p
	}
	if c.Jobs == 0 {
		c.Jobs = min(runtime.NumCPU(), 4)
	}
	if c.Bench.Concurrency == 0 {
		c.Bench.Concurrency = runtime.NumCPU()
	}
	c.Runsc.Path = resolve(c.Runsc.Path)
	c.Rootfs = resolve(c.Rootfs)
	c.CheckpointCache = resolve(c.CheckpointCache)
	c.Output = resolve(c.Output)
	if c.CPUBaseline != nil {
		c.CPUBaseline.File = resolve(c.CPUBaseline.File)
		if err := c.CPUBaseline.resolve(); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
		}
	}
	c.Analysis.Cache = resolve(c.Analysis.Cache)
	return &c, nil
}

func decode(data []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(c)
	if errors.Is(err, io.EOF) {
		return nil // an empty document: nothing to change
	}
	return err
}

// Load reads the config file at path.
func Load(path, cacheDir string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path, filepath.Dir(abs), cacheDir)
}

// CacheDir returns ${XDG_CACHE_HOME:-$HOME/.cache}/readie.
func CacheDir() string {
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "readie")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "readie")
}

// validate checks one package set: its id and its imports.
func (s PackageSet) validate() error {
	var problems []error
	switch {
	case !checkpointid.Valid(s.ID):
		problems = append(problems, checkpointid.Check(s.ID))
	case s.ID == EmptySetID:
		problems = append(problems, fmt.Errorf("id %q is reserved for the set every run captures first", s.ID))
	}
	if len(s.Imports) == 0 {
		problems = append(problems, fmt.Errorf("%s: imports is empty", s.ID))
	}
	for _, m := range s.Imports {
		if !modulePattern.MatchString(m) {
			problems = append(problems, fmt.Errorf("%s: import %q is not a dotted Python module name", s.ID, m))
		}
	}
	return errors.Join(problems...)
}

// ParseSet reads a package set given on the command line as ID=MOD,MOD (`--set`), with the
// same rules as the config's.
func ParseSet(arg string) (PackageSet, error) {
	id, mods, ok := strings.Cut(arg, "=")
	if !ok {
		return PackageSet{}, flagValueError{fmt.Errorf("want ID=MODULE,MODULE")}
	}
	s := PackageSet{ID: strings.TrimSpace(id)}
	for _, m := range strings.Split(mods, ",") {
		if m = strings.TrimSpace(m); m != "" {
			s.Imports = append(s.Imports, m)
		}
	}
	if err := s.validate(); err != nil {
		return PackageSet{}, flagValueError{err}
	}
	return s, nil
}

// Selection is the package sets of a run and which of them it works on.
type Selection struct {
	// Sets are "empty" first, then the config's, with the --set ones replacing those of the
	// same id or added after them.
	Sets []PackageSet
	// Picked names the sets that --only and --set select ("empty" always); nil when neither
	// was given and the run works on every set.
	Picked map[string]bool
}

// Select returns the sets of a run with --only ids and --set sets. An --only id must name a
// set of the config or of --set.
func (c *Config) Select(only []string, extra []PackageSet) (*Selection, error) {
	sel := &Selection{Sets: []PackageSet{{ID: EmptySetID, Imports: []string{}}}}
	byID := map[string]int{}
	for _, s := range c.Checkpoints {
		byID[s.ID] = len(sel.Sets)
		sel.Sets = append(sel.Sets, s)
	}
	for _, s := range extra {
		if i, ok := byID[s.ID]; ok {
			sel.Sets[i] = s
			continue
		}
		byID[s.ID] = len(sel.Sets)
		sel.Sets = append(sel.Sets, s)
	}
	if len(only) == 0 && len(extra) == 0 {
		return sel, nil
	}
	sel.Picked = map[string]bool{EmptySetID: true}
	var unknown []string
	for _, id := range only {
		if _, ok := byID[id]; !ok && id != EmptySetID {
			unknown = append(unknown, id)
		}
		sel.Picked[id] = true
	}
	for _, s := range extra {
		sel.Picked[s.ID] = true
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: --only names unknown package sets: %s", ErrInvalid, strings.Join(unknown, ", "))
	}
	return sel, nil
}

// Picks reports whether the run works on the set id.
func (s *Selection) Picks(id string) bool { return s.Picked == nil || s.Picked[id] }

// ShardOf returns the shard, of n, that the set id belongs to: a hash of the id alone, so a
// set's shard never changes when other sets are added or removed.
func ShardOf(id string, n int) int {
	h := fnv.New64a()
	h.Write([]byte(id))
	return int(h.Sum64() % uint64(n))
}

// ParseShard reads --shard I/N: shard I (from 0, like JOB_COMPLETION_INDEX) of N.
func ParseShard(arg string) (index, count int, err error) {
	i, n, ok := strings.Cut(arg, "/")
	index, errI := strconv.Atoi(strings.TrimSpace(i))
	count, errN := strconv.Atoi(strings.TrimSpace(n))
	if !ok || errI != nil || errN != nil || count < 1 || index < 0 || index >= count {
		return 0, 0, flagValueError{fmt.Errorf("--shard %q: want I/N with 0 <= I < N, e.g. 0/3", arg)}
	}
	return index, count, nil
}

// Shard keeps the sets of shard index of count, and "empty", which every output holds.
func (s *Selection) Shard(index, count int) {
	s.Sets = slices.DeleteFunc(s.Sets, func(set PackageSet) bool {
		return set.ID != EmptySetID && ShardOf(set.ID, count) != index
	})
}
