package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"readie.dev/pipeline/internal/cpubaseline"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/pkg/bytesize"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/sandbox"
)

// problems collects every problem of a config, so that one error names them all.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf(format, args...))
}

// addAt adds a problem of the YAML node n, with its line.
func (p *problems) addAt(n *yaml.Node, format string, args ...any) {
	*p = append(*p, fmt.Errorf("line %d: %s", n.Line, fmt.Sprintf(format, args...)))
}

// validate checks every key of the config, section by section, and reports all problems at once.
func (c *Config) validate() error {
	var p problems
	c.Runsc.validate(&p)
	c.Bench.validate(&p)
	c.validatePaths(&p)
	c.validateCounts(&p)
	c.validatePassEnv(&p)
	if _, err := ref.ParsePlatform(c.Platform); err != nil {
		p.add("platform: %v", err)
	}
	validateCheckpoints(&p, c.Checkpoints)
	return errors.Join(p...)
}

// runscOwnFlags are the global flags the runsc section sets with keys of their own.
var runscOwnFlags = []string{"root", "network", "overlay2", "host-uds", "debug", "debug-log"}

func (r *Runsc) validate(p *problems) {
	if r.Path == "" {
		p.add("runsc.path is empty")
	}
	if r.Root == "" || !filepath.IsAbs(r.Root) {
		p.add("runsc.root %q must be an absolute path", r.Root)
	}
	// The same rules as a worker's kit applies to the manifest (sandbox.ParseFlags): the
	// pipeline never records flags its workers would refuse.
	for _, f := range []struct{ key, flag, value string }{
		{"runsc.network", "--network", r.Network}, {"runsc.overlay", "--overlay2", r.Overlay}, {"runsc.host_uds", "--host-uds", r.HostUDS},
	} {
		if err := sandbox.CheckOwnFlag(f.flag, f.value); err != nil {
			p.add("%s %q: %v", f.key, f.value, err)
		}
	}
	if err := sandbox.CheckRestoreFlags(r.RestoreFlags); err != nil {
		p.add("runsc.restore_flags: %v", err)
	}
	validateGlobalFlags(p, "runsc.global_flags", r.GlobalFlags)
	validateCheckpointOptions(p, "runsc.checkpoint_options", r.CheckpointOptions)
}

// validateGlobalFlags checks further runsc global flags: none that the runsc section sets with
// a key of its own, and only those a worker's kit accepts (sandbox.CheckGlobalFlag).
func validateGlobalFlags(p *problems, where string, flags []string) {
	for _, f := range flags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if slices.Contains(runscOwnFlags, name) {
			p.add("%s: set %q with its own key, not here", where, f)
		} else if err := sandbox.CheckGlobalFlag(f); err != nil {
			p.add("%s: %v", where, err)
		}
	}
}

func validateCheckpointOptions(p *problems, where string, options map[string]string) {
	for k := range options {
		switch k {
		case "exclude-committed-zero-pages", "compression", "direct":
		default:
			p.add("%s: %q is not one of exclude-committed-zero-pages, compression, direct", where, k)
		}
	}
}

func (b *Bench) validate(p *problems) {
	if b.Concurrency < 0 || b.Concurrency > 256 {
		p.add("bench.concurrency %d: want 0 (the number of CPUs) to 256", b.Concurrency)
	}
	variants := map[string]bool{}
	for i, v := range b.Variants {
		where := fmt.Sprintf("bench.variants[%d]", i)
		switch {
		case !variantPattern.MatchString(v.Name):
			p.add("%s: name %q: use letters, digits and - _ , . + = (no spaces or /)", where, v.Name)
		case variants[v.Name]:
			p.add("%s: duplicate name %q", where, v.Name)
		}
		variants[v.Name] = true
		if err := sandbox.CheckRestoreFlags(v.RestoreFlags); err != nil {
			p.add("%s (%s): %v", where, v.Name, err)
		}
		validateCheckpointOptions(p, where+".checkpoint_options", v.CheckpointOptions)
		if v.PageCache != "" && v.PageCache != "warm" && v.PageCache != "cold" {
			p.add("%s (%s): page_cache %q: want warm or cold", where, v.Name, v.PageCache)
		}
		validateGlobalFlags(p, fmt.Sprintf("%s (%s).global_flags", where, v.Name), v.GlobalFlags)
		for _, step := range v.PreCheckpoint {
			if !slices.Contains(PreCheckpointSteps(), step) {
				p.add("%s (%s).pre_checkpoint: %q is not one of %s", where, v.Name, step, strings.Join(PreCheckpointSteps(), ", "))
			}
		}
		if v.Pooled && v.PageCache == "cold" {
			p.add("%s (%s): pooled with page_cache cold is not measured: a pooled variant restores a warm image", where, v.Name)
		}
	}
}

// validatePaths checks that no directory or file the run needs is left empty.
func (c *Config) validatePaths(p *problems) {
	if c.Rootfs == "" {
		p.add("rootfs is empty")
	}
	if c.CheckpointCache == "" {
		p.add("checkpoint_cache is empty")
	}
	if c.Output == "" {
		p.add("output is empty")
	}
}

// validateCounts checks the numbers: jobs, runs, timeouts and limits.
// MaxSandboxCPUs bounds sandbox.cpus: gVisor's CPU sets are sized by the count.
const MaxSandboxCPUs = 1024

func (c *Config) validateCounts(p *problems) {
	if c.Jobs < 0 || c.Jobs > 64 {
		p.add("jobs %d: want 0 (the number of CPUs, at most 4) to 64", c.Jobs)
	}
	if c.Analysis.Runs < 1 || c.Analysis.Runs > 100 {
		p.add("analysis.runs %d: want 1..100", c.Analysis.Runs)
	}
	if c.Analysis.Timeout <= 0 {
		p.add("analysis.timeout must be a positive duration such as 2m")
	}
	if c.Analysis.Cache == "" {
		p.add("analysis.cache is empty")
	}
	if c.Sandbox.CPUs < 1 || c.Sandbox.CPUs > MaxSandboxCPUs {
		p.add("sandbox.cpus %d: want 1..%d (the CPUs every capture's sandbox sees, whatever the build host has)", c.Sandbox.CPUs, MaxSandboxCPUs)
	}
	if c.RestoreRuns < 1 || c.RestoreRuns > 1000 {
		p.add("restore_runs %d: want 1..1000", c.RestoreRuns)
	}
	for name, d := range map[string]time.Duration{
		"capture": c.Timeouts.Capture, "restore": c.Timeouts.Restore,
		"smoke": c.Timeouts.Smoke, "runsc_command": c.Timeouts.RunscCommand, "registry": c.Timeouts.Registry,
		"image_probe": c.Timeouts.ImageProbe,
	} {
		if d <= 0 {
			p.add("timeouts.%s must be a positive duration such as 90s", name)
		}
	}
	for name, n := range map[string]int64{
		"image_bytes": int64(c.Limits.ImageBytes), "image_entries": c.Limits.ImageEntries, "image_file_bytes": int64(c.Limits.ImageFileBytes),
		"sandbox_output": int64(c.Limits.SandboxOutput),
	} {
		if n <= 0 {
			p.add("limits.%s must be positive", name)
		}
	}
	if err := c.SandboxLimits().Check(); err != nil || c.Limits.SandboxMemory == 0 {
		p.add("limits.sandbox_memory %s: want at least %s", bytesize.Size(c.Limits.SandboxMemory), sandbox.MinMemory)
	}
}

func (c *Config) validatePassEnv(p *problems) {
	for _, name := range c.PassEnv {
		if !envPattern.MatchString(name) {
			p.add("pass_env: %q is not an environment variable name", name)
		}
		if slices.ContainsFunc(sandbox.Overrides(sandbox.ModeCapture), func(kv string) bool { return strings.HasPrefix(kv, name+"=") }) || name == sandbox.PreimportEnv || name == capture.CPUBaselineEnv {
			p.add("pass_env: %s is the pipeline's own, set in every sandbox (the executor's settings); it cannot be passed in", name)
		}
		if c.CPUBaseline != nil && slices.Contains(cpubaseline.ControlNames(), name) {
			p.add("pass_env: %s is set by cpu_baseline's library controls; it cannot be passed in as well", name)
		}
	}
}

func validateCheckpoints(p *problems, sets []PackageSet) {
	if len(sets) == 0 {
		p.add("checkpoints lists no package set")
	}
	seen := map[string]bool{}
	for i, s := range sets {
		if err := s.validate(); err != nil {
			p.add("checkpoints[%d]: %w", i, err)
		} else if seen[s.ID] {
			p.add("checkpoints[%d]: duplicate id %q", i, s.ID)
		}
		seen[s.ID] = true
	}
}
