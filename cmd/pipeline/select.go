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
	"readie.dev/pipeline/pkg/pyreq"
)

type selectCmd struct {
	config   configFlag
	out      outFlag
	requires requiresFlag
}

// requiresFlag is --requires, one pip requirement per flag, repeatable; never split on commas
// (pandas>=2.1,<3 is one requirement).
type requiresFlag []pyreq.Requirement

func (r *requiresFlag) String() string {
	var parts []string
	for _, req := range *r {
		parts = append(parts, req.String())
	}
	return strings.Join(parts, " ")
}

func (r *requiresFlag) Set(s string) error {
	req, err := pyreq.ParseRequirement(s)
	if err != nil {
		return err
	}
	*r = append(*r, req)
	return nil
}

func (*selectCmd) Name() string { return "select" }
func (*selectCmd) Usage() string {
	return "select [flags] NAME,NAME... [--requires 'pandas>=2.1,<3' ...]"
}
func (*selectCmd) Synopsis() string {
	return "say where a request that imports NAMES should start (a checkpoint of the output, or cold) and why"
}
func (c *selectCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
	fs.Var(&c.requires, "requires", "a pip requirement the request needs (pandas>=2.1,<3), one per flag, repeatable: a checkpoint holding another version loaded is passed over")
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
	ch := r.SelectFor(c.names(args), c.requires)
	if con.json {
		return writeJSON(con.stdout, ch)
	}
	where := "cold start"
	if !ch.Cold {
		where = "restore " + ch.Checkpoint
	}
	switch {
	case ch.Basis == catalogue.BasisImageSize:
		// Nothing was measured to price it: say so rather than print a price of 0 ms.
		fmt.Fprintf(con.stdout, "%s: chosen by image size, not priced (no measured prices)\n%s\n", where, ch.Why)
	case ch.PredictedPooledMs > 0:
		fmt.Fprintf(con.stdout, "%s: predicted %.0f ms (cold %.0f ms; from a pool %.0f ms)\n%s\n", where, ch.PredictedMs, ch.ColdMs, ch.PredictedPooledMs, ch.Why)
	default:
		fmt.Fprintf(con.stdout, "%s: predicted %.0f ms (cold %.0f ms)\n%s\n", where, ch.PredictedMs, ch.ColdMs, ch.Why)
	}
	for _, p := range ch.PassedOver {
		fmt.Fprintf(con.stdout, "passed over %s: %s\n", p.Checkpoint, p.Why)
	}
	for _, lack := range ch.ImageLacks {
		fmt.Fprintf(con.stdout, "not in the image: %s\n", lack)
	}
	return nil
}
