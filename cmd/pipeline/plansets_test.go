package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// TestPrintWarmSizing: plan-sets' warm sizing takes a set's memory from the output's
// catalogue when a capture of the same set measured it, else predicts it by analyze's memory
// line on the set's predicted image size; without either it says what to do.
func TestPrintWarmSizing(t *testing.T) {
	out := t.TempDir()
	res := &plan.Result{Corpus: plan.CorpusSummary{Planned: plan.PartSummary{Weight: 10}}, Sets: []plan.PlannedSet{
		{ID: "pandas", Imports: []string{"pandas"}, PredictedMiB: 40, RestoreMs: 300, ServedWeight: 6},
		{ID: "numpy", Imports: []string{"numpy"}, PredictedMiB: 20, RestoreMs: 200, ServedWeight: 4},
	}}
	// 30 MiB + 1.25 MiB per MiB of image: pandas 80 MiB, numpy 55 MiB.
	line := catalogue.MemoryLine{InterceptBytes: 30 << 20, BytesPerMiB: 1.25 * (1 << 20)}
	var buf bytes.Buffer
	printWarmSizing(&buf, res, out, catalogue.MemoryLine{}, 2, 1<<30)
	if got := buf.String(); !strings.Contains(got, "not sized") || !strings.Contains(got, "pipeline analyze") {
		t.Errorf("without a catalogue or a memory line:\n%s", got)
	}
	buf.Reset()
	printWarmSizing(&buf, res, out, line, 2, 1<<30)
	if got := buf.String(); strings.Contains(got, "measured\t") || !strings.Contains(got, " 80 ") || !strings.Contains(got, " 55 ") ||
		strings.Count(got, "predicted") < 2 || !strings.Contains(got, "30.0 MiB + 1.25 MiB per MiB") {
		t.Errorf("by the memory line alone:\n%s", got)
	}

	cat := &catalogue.Catalogue{Version: catalogue.Version, CostModel: catalogue.CostModel{ColdStartMs: 900}, Modules: map[string]catalogue.Module{},
		Checkpoints: []catalogue.Checkpoint{
			{ID: "empty", Imports: []string{}, ImageMiB: 10, RestoreMedianMs: 100, ResidentBytes: 60 << 20, OwnBytes: 40 << 20},
			{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 41, RestoreMedianMs: 300, ResidentBytes: 140 << 20, OwnBytes: 113 << 20},
		}}
	if err := atomicfile.WriteJSON(filepath.Join(out, catalogue.FileName), cat); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	printWarmSizing(&buf, res, out, line, 2, 1<<30)
	got := buf.String()
	// pandas measured (113 MiB); numpy predicted by the line (55 MiB), not from empty's.
	if !regexp.MustCompile(`pandas +\d+ +[0-9.]+ +113 +measured`).MatchString(got) || !regexp.MustCompile(`numpy +\d+ +[0-9.]+ +55 +predicted`).MatchString(got) || !strings.Contains(got, "refiller") {
		t.Errorf("warm sizing:\n%s", got)
	}
	// Without a memory line, only the captured set is sized.
	buf.Reset()
	printWarmSizing(&buf, res, out, catalogue.MemoryLine{}, 2, 1<<30)
	if got := buf.String(); !regexp.MustCompile(`pandas +\d+ +[0-9.]+ +113 +measured`).MatchString(got) || strings.Contains(got, "numpy") || strings.Contains(got, "predicted") {
		t.Errorf("without a memory line:\n%s", got)
	}
	buf.Reset()
	printWarmSizing(&buf, res, out, line, 2, 0)
	if !strings.Contains(buf.String(), "under 0 MiB") || !strings.Contains(buf.String(), "does not fit") {
		t.Errorf("a budget of zero:\n%s", buf.String())
	}
	t.Log(got)
}
