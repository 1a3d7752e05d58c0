package main

import (
	"context"
	"flag"
	"fmt"
)

type planCmd struct{ selectionFlags }

func (*planCmd) Name() string  { return "plan" }
func (*planCmd) Usage() string { return "plan [flags]" }
func (*planCmd) Synopsis() string {
	return "print what capture would do with each set (reuse, capture, keep, drop) and why; change nothing"
}
func (c *planCmd) SetFlags(fs *flag.FlagSet) { c.selectionFlags.register(fs) }

func (c *planCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, opts, env, err := c.setup(ctx, con)
	if err != nil {
		return err
	}
	defer env.Close()
	plan, err := env.Plan(ctx, cfg.Output, opts)
	if err != nil {
		return usageIfSetup(err)
	}
	if con.json {
		return writeJSON(con.stdout, plan)
	}
	plan.Log(con.log)
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "set\taction\tfrom\treason\t")
	for _, s := range plan.Sets {
		reason := s.Reason
		if s.Timings != "" {
			reason += " (timings measured under other settings: --remeasure)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", s.ID, s.Action, orDash(s.From), reason)
	}
	for _, d := range plan.Dropped {
		fmt.Fprintf(tw, "%s\tdrop\t-\t%s\t\n", d.ID, d.Reason)
	}
	return tw.Flush()
}
