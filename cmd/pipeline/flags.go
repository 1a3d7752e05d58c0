package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/internal/config"
)

// The flag groups below are registered by the commands they apply to, and only by those: a
// flag that does not apply to a command is an error there.

// configFlag is --config.
type configFlag struct{ path string }

const defaultConfigPath = "pipeline.yaml"

func (c *configFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&c.path, "config", defaultConfigPath, "config file; the embedded default when it is pipeline.yaml and absent")
}

// load reads --config, falling back to the embedded default only for the default name.
func (c *configFlag) load() (*config.Config, error) {
	cfg, err := config.Load(c.path, config.CacheDir())
	if errors.Is(err, os.ErrNotExist) && c.path == defaultConfigPath {
		cwd, cwdErr := os.Getwd()
		if cwdErr != nil {
			return nil, cwdErr
		}
		// No config at all: the defaults alone, those $READIE_DEFAULTS names included (the
		// embedded file given as a config would override them).
		cfg, err = config.Parse(nil, "embedded pipeline.yaml", cwd, config.CacheDir())
	}
	if err != nil {
		return nil, usageError{err}
	}
	return cfg, nil
}

// outFlag is --out: the output directory a command writes or reads (default: the config's
// output). Commands that read an output also take it as their one positional argument.
type outFlag struct{ dir string }

func (o *outFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&o.dir, "out", "", "output directory (default: the config's output)")
}

// apply sets cfg.Output from --out, or from the positional OUT of a command that reads an
// output (args holds at most that one argument).
func (o *outFlag) apply(cfg *config.Config, args []string) error {
	dir := o.dir
	if len(args) == 1 {
		if dir != "" && filepath.Clean(dir) != filepath.Clean(args[0]) {
			return usagef("--out %s and the output %s disagree: name it once", dir, args[0])
		}
		dir = args[0]
	}
	if dir == "" {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return usageError{err}
	}
	cfg.Output = abs
	return nil
}

// readsOutput checks the positional arguments of a command that reads an output: OUT, or none.
func readsOutput(args []string) error {
	if len(args) > 1 {
		return usagef("unexpected arguments: %s (name one output directory, or use --out DIR)", strings.Join(args[1:], " "))
	}
	return nil
}

// onlyFlag is --only.
type onlyFlag struct{ list string }

func (o *onlyFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&o.list, "only", "", "comma-separated package set ids to work on (the empty set is always included)")
}

func (o *onlyFlag) ids() []string {
	var ids []string
	for _, id := range strings.Split(o.list, ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// passEnvFlag is --pass-env of the commands that restore an existing output's checkpoints
// (measure, smoke, bench): the output may be anyone's (a pull), so the config's pass_env
// values go into its sandboxes only when asked.
type passEnvFlag struct{ on bool }

func (p *passEnvFlag) register(fs *flag.FlagSet) {
	fs.BoolVar(&p.on, "pass-env", false, "pass the config's pass_env variables into the sandboxes restored from the output (default: none; the output may be someone else's, e.g. pulled)")
}

// runsFlag is --runs: timed restores per checkpoint.
type runsFlag struct{ runs int }

func (r *runsFlag) register(fs *flag.FlagSet) {
	fs.IntVar(&r.runs, "runs", 0, "timed restores per checkpoint (default: the config's restore_runs)")
}

func (r *runsFlag) apply(cfg *config.Config) error {
	switch {
	case r.runs < 0:
		return usagef("--runs %d: want a positive number", r.runs)
	case r.runs > 0:
		cfg.RestoreRuns = r.runs
	}
	return nil
}

func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected arguments: %s", strings.Join(args, " "))
	}
	return nil
}

// usageError marks bad usage or config: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }
