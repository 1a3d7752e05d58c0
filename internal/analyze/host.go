package analyze

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/measure"
)

// restoreLine is the restore line's measurement: captures of Sets, and the median of
// Options.RestoreRuns measure-mode restores of each.
type restoreLine struct {
	MiB      []float64 `json:"mib"`
	MedianMs []float64 `json:"median_ms"`
}

// measureHost measures the cold start of the bare executor and the restore line over the sets
// of restoreLineSets.
func (a *analyzer) measureHost(ctx context.Context, figures map[string]analysis.Entry) (*analysis.Host, error) {
	cold, _, err := a.timed(ctx, "cold-start", nil, "")
	if err != nil {
		return nil, err
	}
	var starts []float64
	for _, r := range cold.Runs {
		starts = append(starts, r.ColdMs)
	}
	slices.Sort(starts)
	h := &analysis.Host{CPU: a.cpu, ColdStartMs: round3(measure.Percentile(starts, 50))}

	sets := restoreLineSets(figures)
	k := a.timedBase.of("restore-line")
	k.Runs = a.o.RestoreRuns
	k.RestoreFlags = slices.Clone(a.sb.RestoreFlags)
	k.CheckpointOptions = a.sb.Config.Runsc.CheckpointOptions
	k.Sets = sets
	line, fresh, err := lookup(a.cache, k, func() (restoreLine, error) { return a.measureRestoreLine(ctx, sets) })
	if errors.Is(err, errNotCached) {
		// A cached analysis of some modules (capture's catalogue) has no line of its own: the
		// manifest's serves.
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	line.fit(h, sets)
	if fresh {
		a.log.WithFields(logrus.Fields{"cold_start_ms": h.ColdStartMs, "empty_mib": h.EmptyMiB, "alpha_ms_per_mib": h.AlphaMsPerMiB, "intercept_ms": h.InterceptMs, "sets": strings.Join(h.RestoreSets, " ")}).Info("analyze: restore line measured")
	}
	return h, nil
}

// restoreLineSets are the sets the restore line is measured over: the empty set and the
// modules whose images are the largest and about half of that, so the line spans the sizes a
// plan chooses from.
func restoreLineSets(figures map[string]analysis.Entry) [][]string {
	sets := [][]string{{}}
	var modules []string
	for m, e := range figures {
		if e.MiB > 0.5 {
			modules = append(modules, m)
		}
	}
	slices.SortFunc(modules, func(x, y string) int {
		if figures[x].MiB != figures[y].MiB {
			return cmpFloat(figures[y].MiB, figures[x].MiB)
		}
		return strings.Compare(x, y)
	})
	if len(modules) == 0 {
		return sets
	}
	largest := modules[0]
	sets = append(sets, []string{largest})
	half, best := "", math.Inf(1)
	for _, m := range modules[1:] {
		if d := math.Abs(figures[m].MiB - figures[largest].MiB/2); d < best {
			half, best = m, d
		}
	}
	if half != "" {
		sets = append(sets, []string{half})
	}
	return sets
}

// fit puts the line's fit through the measured sets into h.
func (line restoreLine) fit(h *analysis.Host, sets [][]string) {
	var sizes []int64
	for _, mib := range line.MiB {
		sizes = append(sizes, int64(mib*(1<<20)))
	}
	fit := measure.CostModel(sizes, line.MedianMs)
	h.EmptyMiB = round3(line.MiB[0])
	h.InterceptMs, h.AlphaMsPerMiB, h.RSquared = round3(max(fit.Intercept, 0)), round3(max(fit.Slope, 0)), round3(fit.RSquared)
	for _, s := range sets {
		name := strings.Join(s, ",")
		if name == "" {
			name = config.EmptySetID
		}
		h.RestoreSets = append(h.RestoreSets, name)
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// measureRestoreLine captures each set into the scratch directory, times its restores one at a
// time, and removes the images.
func (a *analyzer) measureRestoreLine(ctx context.Context, sets [][]string) (restoreLine, error) {
	box, err := a.starter(ctx)
	if err != nil {
		return restoreLine{}, err
	}
	version := a.env.Runsc.Version // asked once, by run.NewEnv
	var line restoreLine
	for i, set := range sets {
		dir := filepath.Join(a.work, fmt.Sprintf("line-%d", i))
		box.started.Add(int64(1 + a.o.RestoreRuns))
		meta, err := capture.Run(ctx, a.sb.Runtime, a.sb.CaptureRequest(config.Set{ID: "analyze", Imports: set}, dir, a.work, version, a.sb.Config.Runsc.CheckpointOptions))
		if err != nil {
			os.RemoveAll(dir)
			return restoreLine{}, fmt.Errorf("restore line: %w", err)
		}
		stats, err := a.sb.Restorer(a.work, a.sb.Config.Timeouts.Restore).MeasureRuns(ctx, "analyze", dir, a.o.RestoreRuns)
		os.RemoveAll(dir)
		if err != nil {
			return restoreLine{}, fmt.Errorf("restore line: %w", err)
		}
		line.MiB = append(line.MiB, float64(meta.Bytes())/(1<<20))
		line.MedianMs = append(line.MedianMs, stats.Median)
	}
	return line, nil
}
