// Package config reads and validates pipeline.yaml.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	pipeline "readie.dev/pipeline"
)

// EmptySetID is the package set with no imports that every run captures first.
const EmptySetID = "empty"

// ErrInvalid wraps every config problem.
var ErrInvalid = errors.New("invalid config")

// Set is one package set: a checkpoint with these modules pre-imported.
type Set struct {
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

// Timeouts bound every wait on something outside the process.
type Timeouts struct {
	Capture      time.Duration `yaml:"capture"`
	Restore      time.Duration `yaml:"restore"`
	Smoke        time.Duration `yaml:"smoke"`
	RunscCommand time.Duration `yaml:"runsc_command"`
}

// Config is pipeline.yaml.
type Config struct {
	Runsc       Runsc    `yaml:"runsc"`
	Rootfs      string   `yaml:"rootfs"`
	Output      string   `yaml:"output"`
	RestoreRuns int      `yaml:"restore_runs"`
	Timeouts    Timeouts `yaml:"timeouts"`
	// PassEnv names variables of the pipeline's environment to pass into every sandbox. Nothing
	// else of it is passed: a checkpoint ships to every sandbox, with whatever it holds.
	PassEnv     []string `yaml:"pass_env"`
	Checkpoints []Set    `yaml:"checkpoints"`
}

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	envPattern    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	modulePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// Parse reads a config from data over the defaults (the embedded pipeline.yaml): a key the
// config leaves out keeps its default, a list it gives replaces the default's. baseDir
// resolves relative paths and cacheDir replaces "{cache}". Unknown keys, bad values and
// duplicate ids are errors that name the problem.
func Parse(data []byte, name, baseDir, cacheDir string) (*Config, error) {
	var c Config
	if err := decode(pipeline.DefaultConfig(), &c); err != nil {
		return nil, fmt.Errorf("%w: the embedded default config: %w", ErrInvalid, err)
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
	c.Runsc.Path = resolve(c.Runsc.Path)
	c.Rootfs = resolve(c.Rootfs)
	c.Output = resolve(c.Output)
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

// CacheDir is ${XDG_CACHE_HOME:-$HOME/.cache}/readie.
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

func (c *Config) validate() error {
	var problems []error
	add := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if c.Runsc.Path == "" {
		add("runsc.path is empty")
	}
	if c.Runsc.Root == "" || !filepath.IsAbs(c.Runsc.Root) {
		add("runsc.root %q must be an absolute path", c.Runsc.Root)
	}
	switch c.Runsc.Network {
	case "none", "sandbox", "host":
	default:
		add("runsc.network %q: want none, sandbox or host", c.Runsc.Network)
	}
	if c.Runsc.Overlay == "" {
		add("runsc.overlay is empty (use none)")
	}
	switch c.Runsc.HostUDS {
	case "create", "all":
	default:
		add("runsc.host_uds %q: want create or all (the executor's socket must reach the host)", c.Runsc.HostUDS)
	}
	for _, f := range c.Runsc.RestoreFlags {
		if !strings.HasPrefix(f, "-") {
			add("runsc.restore_flags: %q is not a flag", f)
		}
	}
	for _, f := range c.Runsc.GlobalFlags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		switch {
		case !strings.HasPrefix(f, "--"):
			add("runsc.global_flags: %q is not a --flag", f)
		case slices.Contains([]string{"root", "network", "overlay2", "host-uds", "debug", "debug-log"}, name):
			add("runsc.global_flags: set %q with its own key, not here", f)
		}
	}
	for k := range c.Runsc.CheckpointOptions {
		switch k {
		case "exclude-committed-zero-pages", "compression", "direct":
		default:
			add("runsc.checkpoint_options: %q is not one of exclude-committed-zero-pages, compression, direct", k)
		}
	}
	if c.Rootfs == "" {
		add("rootfs is empty")
	}
	if c.Output == "" {
		add("output is empty")
	}
	if c.RestoreRuns < 1 || c.RestoreRuns > 1000 {
		add("restore_runs %d: want 1..1000", c.RestoreRuns)
	}
	for name, d := range map[string]time.Duration{
		"capture": c.Timeouts.Capture, "restore": c.Timeouts.Restore,
		"smoke": c.Timeouts.Smoke, "runsc_command": c.Timeouts.RunscCommand,
	} {
		if d <= 0 {
			add("timeouts.%s must be a positive duration such as 90s", name)
		}
	}
	for _, name := range c.PassEnv {
		if !envPattern.MatchString(name) {
			add("pass_env: %q is not an environment variable name", name)
		}
	}
	if len(c.Checkpoints) == 0 {
		add("checkpoints lists no package set")
	}
	seen := map[string]bool{}
	for i, s := range c.Checkpoints {
		switch {
		case !idPattern.MatchString(s.ID):
			add("checkpoints[%d]: id %q: use 1-64 letters, digits, - and _", i, s.ID)
		case s.ID == EmptySetID:
			add("checkpoints[%d]: id %q is reserved for the set every run captures first", i, s.ID)
		case seen[s.ID]:
			add("checkpoints[%d]: duplicate id %q", i, s.ID)
		}
		seen[s.ID] = true
		if len(s.Imports) == 0 {
			add("checkpoints[%d] (%s): imports is empty", i, s.ID)
		}
		for _, m := range s.Imports {
			if !modulePattern.MatchString(m) {
				add("checkpoints[%d] (%s): import %q is not a dotted Python module name", i, s.ID, m)
			}
		}
	}
	return errors.Join(problems...)
}

// Sets returns the package sets of a run: "empty" first, then the configured ones, limited
// to only when it is not empty (the empty set is always kept).
func (c *Config) Sets(only []string) ([]Set, error) {
	sets := []Set{{ID: EmptySetID, Imports: []string{}}}
	want := map[string]bool{}
	for _, id := range only {
		want[id] = true
	}
	for _, s := range c.Checkpoints {
		if len(only) == 0 || want[s.ID] {
			sets = append(sets, s)
			delete(want, s.ID)
		}
	}
	delete(want, EmptySetID)
	if len(want) > 0 {
		var unknown []string
		for id := range want {
			unknown = append(unknown, id)
		}
		return nil, fmt.Errorf("%w: --only names unknown package sets: %s", ErrInvalid, strings.Join(unknown, ", "))
	}
	return sets, nil
}
