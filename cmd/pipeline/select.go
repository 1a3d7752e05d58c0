package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/pkg/catalogue"
)

type selectCmd struct {
	config configFlag
	out    outFlag
}

func (*selectCmd) Name() string  { return "select" }
func (*selectCmd) Usage() string { return "select [flags] NAME,NAME..." }
func (*selectCmd) Synopsis() string {
	return "say where a request that imports NAMES should start (a checkpoint of the output, or cold) and why"
}
func (c *selectCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
}

// names are the request's imports: comma-separated, in one argument or several.
func (*selectCmd) names(args []string) []string {
	var names []string
	for _, a := range args {
		for _, n := range strings.Split(a, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
	}
	return names
}

func (c *selectCmd) CheckArgs(args []string) error {
	for _, n := range c.names(args) {
		if !catalogue.IsModuleName(n) {
			return fmt.Errorf("%q is not a dotted Python name", n)
		}
	}
	if len(args) == 0 {
		return errors.New("name the request's imports: pipeline select pandas,seaborn (none: an empty argument \"\")")
	}
	return nil
}

func (c *selectCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, nil); err != nil {
		return err
	}
	path := filepath.Join(cfg.Output, catalogue.FileName)
	cat, err := catalogue.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return usagef("%s does not exist: capture into %s first", path, cfg.Output)
	}
	if err != nil {
		return usageError{err}
	}
	r, err := catalogue.NewRouter(cat)
	if err != nil {
		return usageError{fmt.Errorf("%s: %w", path, err)}
	}
	ch := r.Select(c.names(args))
	if con.json {
		return writeJSON(con.stdout, ch)
	}
	where := "cold start"
	if !ch.Cold {
		where = "restore " + ch.Checkpoint
	}
	fmt.Fprintf(con.stdout, "%s: predicted %.0f ms (cold %.0f ms)\n%s\n", where, ch.PredictedMs, ch.ColdMs, ch.Why)
	return nil
}
