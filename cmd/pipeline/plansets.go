package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"slices"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/setplan"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
	"readie.dev/pipeline/pkg/manifest"
)

type planSetsCmd struct {
	corpusFlags
	analysis  string
	maxSets   int
	budgetMiB float64
	// rate and warmMemory size the warm pools the plan implies (printWarmSizing).
	rate            float64
	warmMemory      string
	warmMemoryBytes int64
}

func (*planSetsCmd) Name() string  { return "plan-sets" }
func (*planSetsCmd) Usage() string { return "plan-sets --corpus FILE [flags]" }
func (*planSetsCmd) Synopsis() string {
	return "choose the package sets that minimise a corpus's expected start cost; write OUT/plan.json"
}
func (c *planSetsCmd) SetFlags(fs *flag.FlagSet) {
	d := plan.DefaultOptions()
	c.corpusFlags.register(fs, "the corpus of requests, as analyzed (required)")
	fs.StringVar(&c.analysis, "analysis", "", "the corpus's analysis (default: OUT/analysis.json)")
	fs.IntVar(&c.maxSets, "max-sets", d.MaxSets, "K: the most sets to checkpoint besides empty")
	fs.Float64Var(&c.budgetMiB, "budget-mib", d.BudgetMiB, "the most MiB of predicted images the sets may take together (empty aside)")
	fs.Float64Var(&c.rate, "rate", 1, "requests a second the corpus stands for: with --warm-memory, sizes the warm pools the plan implies")
	fs.StringVar(&c.warmMemory, "warm-memory", "4GiB", "the memory budget of warm sandboxes (bytes, or with KiB, MiB, GiB) for the warm sizing the report shows")
}

func (c *planSetsCmd) CheckArgs(args []string) error {
	if c.corpus.path == "" {
		return errors.New("--corpus FILE is required")
	}
	if c.maxSets < 0 || c.maxSets > 1000 {
		return fmt.Errorf("--max-sets %d: want 0..1000", c.maxSets)
	}
	if !(c.budgetMiB >= 0) || math.IsInf(c.budgetMiB, 0) {
		return fmt.Errorf("--budget-mib %v: want a number of MiB >= 0", c.budgetMiB)
	}
	if !(c.rate >= 0) || c.rate > 1e6 {
		return fmt.Errorf("--rate %v: want requests a second, 0 to 1e6", c.rate)
	}
	var err error
	if c.warmMemoryBytes, err = parseBytes(c.warmMemory); err != nil {
		return fmt.Errorf("--warm-memory %w", err)
	}
	return noArgs(args)
}

func (c *planSetsCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, cp, err := c.corpusFlags.load()
	if err != nil {
		return err
	}
	path := c.analysis
	if path == "" {
		path = filepath.Join(cfg.Output, analysis.FileName)
	}
	a, err := analysis.Load(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return usagef("%s does not exist: run `pipeline analyze --corpus %s` first", path, c.corpus.path)
		}
		return usageError{err}
	}
	model, source, err := costModel(cfg.Output, a)
	if err != nil {
		return err
	}
	res, err := setplan.Plan(cp, a, model, plan.Options{MaxSets: c.maxSets, BudgetMiB: c.budgetMiB})
	if err != nil {
		return usageError{err}
	}
	res.CostSource = source
	if err := outdir.WriteFile(cfg.Output, plan.FileName, res.Save); err != nil {
		return usageIfSetup(err)
	}
	if con.json {
		return writeJSON(con.stdout, res)
	}
	fmt.Fprintf(con.stdout, "cost model: %s\n", source)
	if err := res.WriteSummary(con.stdout); err != nil {
		return err
	}
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "set\tpredicted MiB\trestore ms\tserved weight\tholds\t")
	for _, s := range res.Sets {
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%.0f\t%d modules\t\n", s.ID, s.PredictedMiB, s.RestoreMs, s.ServedWeight, len(s.Closure))
	}
	tw.Flush()
	printWarmSizing(con.stdout, res, cfg.Output, a.Host.Memory, c.rate, c.warmMemoryBytes)
	fmt.Fprintf(con.stdout, "\nwrote %s; `pipeline capture --plan %s` captures these sets:\n\n", filepath.Join(cfg.Output, plan.FileName), filepath.Join(cfg.Output, plan.FileName))
	return setplan.WriteConfigBlock(con.stdout, setplan.ConfigSets(res))
}

// printWarmSizing prints the warm pools the plan implies (catalogue.SizeWarm): each set's share
// of rate by its served weight, its restore saved and its refill, and its own memory restored
// and idle: measured by the capture of a set of the same id and imports in the output's catalogue,
// else predicted by analyze's memory line on its predicted image size; without either, it says
// what to measure.
func printWarmSizing(w io.Writer, res *plan.Result, out string, line catalogue.MemoryLine, rate float64, budget int64) {
	fmt.Fprintf(w, "\nwarm sandboxes under %.0f MiB at %.2f requests a second (--warm-memory, --rate): ", float64(budget)/(1<<20), rate)
	measured := map[string]catalogue.Checkpoint{}
	path := filepath.Join(out, catalogue.FileName)
	cat, err := catalogue.Load(path)
	if err == nil {
		for _, cp := range cat.Checkpoints {
			if cp.OwnBytes > 0 {
				measured[cp.ID] = cp
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "(no measured memory from the catalogue: %v) ", err)
	}
	total := res.Corpus.Planned.Weight
	var demand []catalogue.WarmDemand
	source := map[string]string{}
	predicted := false
	for _, s := range res.Sets {
		own := int64(0)
		if cp, ok := measured[s.ID]; ok && slices.Equal(cp.Imports, s.Imports) {
			own, source[s.ID] = cp.OwnBytes, "measured"
		} else if line.Measured() {
			own, source[s.ID], predicted = line.OwnBytes(s.PredictedMiB), "predicted", true
		} else {
			continue
		}
		share := 0.0
		if total > 0 {
			share = s.ServedWeight / total
		}
		demand = append(demand, catalogue.WarmDemand{Set: s.ID, RatePerSec: rate * share, SavingMs: s.RestoreMs, RefillMs: s.RestoreMs, OwnBytes: own})
	}
	if len(demand) == 0 {
		fmt.Fprintf(w, "not sized: the analysis has no memory line and %s no measured memory of these sets (run `pipeline analyze` again, or capture the plan, then plan again)\n", path)
		return
	}
	sizing, err := catalogue.SizeWarm(demand, budget)
	if err != nil {
		fmt.Fprintf(w, "not sized: %v\n", err)
		return
	}
	fmt.Fprintf(w, "%.0f MiB, %.0f ms of starts saved a second, the one refiller %.0f%% busy\n", float64(sizing.MemoryBytes)/(1<<20), sizing.SavedMsPerSec, 100*sizing.RefillLoad)
	if sizing.Why != "" {
		fmt.Fprintln(w, sizing.Why)
	}
	if predicted {
		fmt.Fprintf(w, "memory measured by a capture of the set, else predicted by analyze's memory line: %.1f MiB + %.2f MiB per MiB of image\n",
			float64(line.InterceptBytes)/(1<<20), line.BytesPerMiB/(1<<20))
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "set\twarm\thit rate\tMiB each\tmemory\t")
	for _, s := range sizing.Sets {
		each := 0.0
		for _, d := range demand {
			if d.Set == s.Set {
				each = float64(d.OwnBytes) / (1 << 20)
			}
		}
		note := source[s.Set]
		if s.Why != "" {
			note += "; " + s.Why
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%s\t\n", s.Set, s.Size, s.HitRate, each, note)
	}
	tw.Flush()
}

// costModel is this host's cost model for planning: the restore line of the output's manifest
// when it has two image sizes or more and was made from the analysed image, else the line the
// analysis measured; the cold start always from the analysis. source says which.
func costModel(out string, a *analysis.File) (catalogue.CostModel, string, error) {
	h := a.Host
	if h == nil {
		return catalogue.CostModel{}, "", usagef("the analysis has no host figures (cold start, restore line): run `pipeline analyze` again")
	}
	model := catalogue.CostModel{InterceptMs: h.InterceptMs, AlphaMsPerMiB: h.AlphaMsPerMiB, ColdStartMs: h.ColdStartMs, EmptyMiB: h.EmptyMiB}
	measured := fmt.Sprintf("restore %.2f ms/MiB + %.0f ms measured by analyze (R² %.2f over %d checkpoints), empty image %.1f MiB; cold start %.0f ms measured by analyze",
		model.AlphaMsPerMiB, model.InterceptMs, h.RSquared, len(h.RestoreSets), model.EmptyMiB, model.ColdStartMs)
	path := filepath.Join(out, manifest.FileName)
	m, err := manifest.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return model, measured + " (no manifest in the output)", nil
	}
	if err != nil {
		return model, measured + fmt.Sprintf(" (the output's manifest cannot be read: %v)", err), nil
	}
	if err := outcatalogue.MatchesManifest(a, m); err != nil {
		return model, measured + fmt.Sprintf(" (not the output's manifest's: %v)", err), nil
	}
	var sizes []int64
	empty := -1.0
	for _, cp := range m.Checkpoints {
		if !slices.Contains(sizes, cp.Bytes) {
			sizes = append(sizes, cp.Bytes)
		}
		if cp.ID == config.EmptySetID {
			empty = float64(cp.Bytes) / (1 << 20)
		}
	}
	if len(sizes) < 2 || empty < 0 || m.AlphaMsPerMiB < 0 || m.InterceptMs < 0 {
		return model, measured + fmt.Sprintf(" (%s has %d image sizes: too few for a line)", path, len(sizes)), nil
	}
	model.AlphaMsPerMiB, model.InterceptMs, model.EmptyMiB = m.AlphaMsPerMiB, m.InterceptMs, empty
	return model, fmt.Sprintf("restore %.2f ms/MiB + %.0f ms from %s (%d checkpoints, %d sizes), empty image %.1f MiB; cold start %.0f ms measured by analyze",
		model.AlphaMsPerMiB, model.InterceptMs, path, len(m.Checkpoints), len(sizes), model.EmptyMiB, model.ColdStartMs), nil
}
