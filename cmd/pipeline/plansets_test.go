package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// TestPrintWarmSizing: plan-sets' warm sizing takes a set's memory from the output's
// catalogue when a capture of the same set measured it, else predicts it from the empty set's;
// without a catalogue it says what to do.
func TestPrintWarmSizing(t *testing.T) {
	out := t.TempDir()
	res := &plan.Result{Corpus: plan.CorpusSummary{Planned: plan.PartSummary{Weight: 10}}, Sets: []plan.PlannedSet{
		{ID: "pandas", Imports: []string{"pandas"}, PredictedMiB: 40, RestoreMs: 300, ServedWeight: 6},
		{ID: "numpy", Imports: []string{"numpy"}, PredictedMiB: 20, RestoreMs: 200, ServedWeight: 4},
	}}
	var buf bytes.Buffer
	printWarmSizing(&buf, res, out, 2, 1<<30)
	if !strings.Contains(buf.String(), "not sized: no catalogue") {
		t.Errorf("without a catalogue:\n%s", buf.String())
	}
	cat := &catalogue.Catalogue{Version: catalogue.Version, CostModel: catalogue.CostModel{ColdStartMs: 900}, Modules: map[string]catalogue.Module{},
		Checkpoints: []catalogue.Checkpoint{
			{ID: "empty", Imports: []string{}, ImageMiB: 10, RestoreMedianMs: 100, ResidentBytes: 40 << 20},
			{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 41, RestoreMedianMs: 300, ResidentBytes: 113 << 20},
		}}
	if err := atomicfile.WriteJSON(filepath.Join(out, catalogue.FileName), cat); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	printWarmSizing(&buf, res, out, 2, 1<<30)
	got := buf.String()
	// pandas measured (113 MiB); numpy predicted: empty's 40 MiB + (20 - 10) MiB = 50 MiB.
	if !strings.Contains(got, "measured") || !strings.Contains(got, "predicted") || !strings.Contains(got, " 113 ") || !strings.Contains(got, " 50 ") || !strings.Contains(got, "refiller") {
		t.Errorf("warm sizing:\n%s", got)
	}
	buf.Reset()
	printWarmSizing(&buf, res, out, 2, 0)
	if !strings.Contains(buf.String(), "under 0 MiB") || !strings.Contains(buf.String(), "does not fit") {
		t.Errorf("a budget of zero:\n%s", buf.String())
	}
	t.Log(got)
}
