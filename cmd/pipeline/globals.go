package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	pipeline "readie.dev/pipeline"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
)

// globals are the flags every subcommand takes.
type globals struct {
	configPath string
	out        string
	only       string
	runs       int
	logFormat  string
	verbose    bool

	stdout, stderr io.Writer
	log            *logrus.Logger
}

// register adds the global flags to fs, with the values already set as defaults, so that a
// subcommand's action can take them again after its own name (`pipeline cache ACTION --config
// ...`).
func (g *globals) register(fs *flag.FlagSet) {
	if g.configPath == "" {
		g.configPath = "pipeline.yaml"
	}
	if g.logFormat == "" {
		g.logFormat = "text"
	}
	fs.StringVar(&g.configPath, "config", g.configPath, "config file; the embedded default when it is pipeline.yaml and absent")
	fs.StringVar(&g.out, "out", g.out, "output directory (default: the config's output)")
	fs.StringVar(&g.only, "only", g.only, "comma-separated package set ids to work on (the empty set is always captured)")
	fs.IntVar(&g.runs, "runs", g.runs, "timed restores per checkpoint (default: the config's restore_runs)")
	fs.StringVar(&g.logFormat, "log-format", g.logFormat, "log format on stderr: text or json")
	fs.BoolVar(&g.verbose, "v", g.verbose, "debug logging")
}

// parseAction parses the flags of a subcommand's action (fs) together with the global flags.
func (g *globals) parseAction(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(g.stderr)
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	log, err := g.logger()
	if err != nil {
		return usageError{err}
	}
	g.log = log
	return nil
}

func (g *globals) logger() (*logrus.Logger, error) {
	return newLogger(g.stderr, g.logFormat, g.verbose)
}

// loadConfig reads --config, falling back to the embedded default only for the default name.
func (g *globals) loadConfig() (*config.Config, error) {
	cfg, err := config.Load(g.configPath, config.CacheDir())
	if errors.Is(err, os.ErrNotExist) && g.configPath == "pipeline.yaml" {
		cwd, cwdErr := os.Getwd()
		if cwdErr != nil {
			return nil, cwdErr
		}
		cfg, err = config.Parse(pipeline.DefaultConfig(), "embedded pipeline.yaml", cwd, config.CacheDir())
	}
	if err != nil {
		return nil, usageError{err}
	}
	if g.runs < 0 {
		return nil, usagef("--runs %d: want a positive number", g.runs)
	}
	if g.runs > 0 {
		cfg.RestoreRuns = g.runs
	}
	if g.out != "" {
		abs, err := filepath.Abs(g.out)
		if err != nil {
			return nil, usageError{err}
		}
		cfg.Output = abs
	}
	return cfg, nil
}

func (g *globals) onlyIDs() []string {
	var ids []string
	for _, id := range strings.Split(g.only, ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// env checks the runsc that cfg names and prepares a run.
func (g *globals) env(ctx context.Context, cfg *config.Config) (*run.Env, error) {
	env, err := run.NewEnv(ctx, cfg, g.log)
	if err != nil {
		return nil, usageIfSetup(err)
	}
	return env, nil
}

func usageIfSetup(err error) error {
	if errors.Is(err, run.ErrSetup) {
		return usageError{err}
	}
	return err
}

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u) || errors.Is(err, config.ErrInvalid)
}

func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected arguments: %s", strings.Join(args, " "))
	}
	return nil
}
