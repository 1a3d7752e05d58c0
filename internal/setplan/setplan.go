// Package setplan is the pipeline's side of the planner (package catalogue/plan): it plans
// from a corpus file and an analysis.json, and writes a plan's sets as the config's package
// sets.
package setplan

import (
	"io"

	"gopkg.in/yaml.v3"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// Plan plans sets for the corpus c, with what the analysis a measured, under the cost model.
func Plan(c *corpus.Corpus, a *analysis.File, model catalogue.CostModel, opt plan.Options) (*plan.Result, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return plan.Plan(Input(c, a), model, opt)
}

// Input returns the planner's input: c's requests (held out as corpus.HeldOut says), each
// name they import resolved to its module by a, and a's modules.
func Input(c *corpus.Corpus, a *analysis.File) plan.Input {
	in := plan.Input{Names: make(map[string]string, len(a.Names)), Modules: a.Modules()}
	for name, e := range a.Names {
		in.Names[name] = e.Module
	}
	for i, r := range c.Requests {
		in.Requests = append(in.Requests, plan.Request{Imports: r.Imports, Weight: r.Weight, Line: r.Line, HeldOut: corpus.HeldOut(i)})
	}
	return in
}

// ConfigSets returns the plan's sets as the config's package sets.
func ConfigSets(r *plan.Result) []config.PackageSet {
	out := make([]config.PackageSet, 0, len(r.Sets))
	for _, s := range r.Sets {
		out = append(out, config.PackageSet{ID: s.ID, Imports: s.Imports})
	}
	return out
}

// WriteConfigBlock writes sets as a `checkpoints:` block of pipeline.yaml.
func WriteConfigBlock(w io.Writer, sets []config.PackageSet) error {
	var doc struct {
		Checkpoints []config.PackageSet `yaml:"checkpoints"`
	}
	doc.Checkpoints = sets
	if sets == nil {
		doc.Checkpoints = []config.PackageSet{}
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}
