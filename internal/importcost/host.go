package importcost

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
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

// pooledLine is the pooled line's measurement, over the restore line's sets: for each, the
// median of Options.RestoreRuns restores onto a sandbox created ahead; and the median of as
// many cold starts in one. Each is timed from `runsc restore` (or `runsc start`) to the answer.
type pooledLine struct {
	MiB         []float64 `json:"mib"`
	MedianMs    []float64 `json:"median_ms"`
	ColdStartMs float64   `json:"cold_start_ms"`
}

// memoryLine is the memory line's measurement, over the restore line's sets: for each, the
// median over Options.RestoreRuns of the own memory (launch.Memory.Own) of the pooled line's
// sandbox restored from it, once it answered, idle.
type memoryLine struct {
	MiB      []float64 `json:"mib"`
	OwnBytes []int64   `json:"own_bytes"`
}

// check wants a positive memory per image: a line through anything else would report a memory
// no sandbox held.
func (line memoryLine) check() error {
	if len(line.OwnBytes) == 0 || len(line.OwnBytes) != len(line.MiB) || slices.ContainsFunc(line.OwnBytes, func(b int64) bool { return b <= 0 }) {
		return fmt.Errorf("memory line: own memory %v over images of %v MiB: want a positive memory per image", line.OwnBytes, line.MiB)
	}
	return nil
}

// UnmarshalJSON refuses a measurement that check refuses, so that the analysis cache measures
// such an entry again (cache.get) rather than serving it.
func (line *memoryLine) UnmarshalJSON(data []byte) error {
	type plain memoryLine // without this method
	var p plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return err
	}
	if err := memoryLine(p).check(); err != nil {
		return err
	}
	*line = memoryLine(p)
	return nil
}

// measureHost measures the cold start of the bare executor, and the restore line, the pooled
// line and the memory line over the sets of restoreLineSets.
func (a *analyzer) measureHost(ctx context.Context, figures map[string]analysis.Entry) (*analysis.HostCosts, error) {
	cold, _, err := a.timed(ctx, "cold-start", nil, "")
	if err != nil {
		return nil, err
	}
	var starts []float64
	for _, r := range cold.Runs {
		starts = append(starts, r.ColdMs)
	}
	slices.Sort(starts)
	h := &analysis.HostCosts{CPU: a.cpu, ColdStartMs: round3(measure.Percentile(starts, 50))}

	sets := restoreLineSets(figures)
	k := a.timedBase.of("restore-line")
	k.Runs = a.o.RestoreRuns
	k.RestoreFlags = slices.Clone(a.sb.RestoreFlags)
	k.CheckpointOptions = a.sb.Config.Runsc.CheckpointOptions
	k.Sets = sets
	// A restore line measured now measures the pooled and memory lines too, on the same
	// captures.
	var pooled *pooledLine
	var memory *memoryLine
	line, fresh, err := lookup(a.cache, k, func() (restoreLine, error) {
		line, p, m, err := a.measureLines(ctx, sets, true)
		pooled, memory = p, m
		return line, err
	})
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
	// Its own entry, so that a cache of the restore line from before the pooled line still
	// serves it: only the pooled line is measured then.
	pl, fresh, err := lookup(a.cache, k.of("pooled-line"), func() (pooledLine, error) {
		if pooled != nil {
			return *pooled, nil
		}
		_, p, m, err := a.measureLines(ctx, sets, false)
		if err != nil {
			return pooledLine{}, err
		}
		memory = m
		return *p, nil
	})
	if errors.Is(err, errNotCached) {
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	pl.fit(h)
	if fresh {
		a.log.WithFields(logrus.Fields{"cold_start_ms": h.Pooled.ColdStartMs, "alpha_ms_per_mib": h.Pooled.AlphaMsPerMiB, "intercept_ms": h.Pooled.InterceptMs}).Info("analyze: pooled line measured")
	}
	// Its own entry too: a cache of the pooled line from before the memory line has none, and
	// measures it then rather than reporting none as measured.
	ml, fresh, err := lookup(a.cache, k.of("memory-line"), func() (memoryLine, error) {
		if memory != nil {
			return *memory, nil
		}
		_, _, m, err := a.measureLines(ctx, sets, false)
		if err != nil {
			return memoryLine{}, err
		}
		return *m, nil
	})
	if errors.Is(err, errNotCached) {
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	ml.fit(h)
	if fresh {
		a.log.WithFields(logrus.Fields{"intercept_bytes": h.Memory.InterceptBytes, "bytes_per_mib": h.Memory.BytesPerMiB, "r_squared": h.MemoryRSquared}).Info("analyze: memory line measured")
	}
	return h, nil
}

// restoreLineSets returns the sets the restore line is measured over: the empty set and the
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
			return cmp.Compare(figures[y].MiB, figures[x].MiB)
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
func (line restoreLine) fit(h *analysis.HostCosts, sets [][]string) {
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

// fit puts the pooled line's fit and cold start into h.
func (line pooledLine) fit(h *analysis.HostCosts) {
	var sizes []int64
	for _, mib := range line.MiB {
		sizes = append(sizes, int64(mib*(1<<20)))
	}
	fit := measure.CostModel(sizes, line.MedianMs)
	h.Pooled.InterceptMs, h.Pooled.AlphaMsPerMiB, h.PooledRSquared = round3(max(fit.Intercept, 0)), round3(max(fit.Slope, 0)), round3(fit.RSquared)
	h.Pooled.ColdStartMs = round3(line.ColdStartMs)
}

// fit puts the memory line's fit into h.
func (line memoryLine) fit(h *analysis.HostCosts) {
	sizes, own := make([]int64, len(line.MiB)), make([]float64, len(line.OwnBytes))
	for i := range line.MiB {
		sizes[i], own[i] = int64(line.MiB[i]*(1<<20)), float64(line.OwnBytes[i])
	}
	fit := measure.CostModel(sizes, own)
	h.Memory.InterceptBytes, h.Memory.BytesPerMiB, h.MemoryRSquared = int64(max(fit.Intercept, 0)), math.Round(max(fit.Slope, 0)), round3(fit.RSquared)
}

// measureLines captures each set into the scratch directory, then times round by round, one at
// a time, a restore of each image onto a sandbox created ahead (whose own memory it reads once
// the executor answered) and, withRestore, a measure-mode restore, and a pooled cold start, and
// removes the images. Rounds over every set, rather than every run of one set then the next,
// let a change of the machine's load shift the whole line instead of tilting it.
func (a *analyzer) measureLines(ctx context.Context, sets [][]string, withRestore bool) (restoreLine, *pooledLine, *memoryLine, error) {
	box, err := a.starter(ctx)
	if err != nil {
		return restoreLine{}, nil, nil, err
	}
	version := a.env.Runsc.Version // asked once, by run.NewEnv
	dirs := make([]string, len(sets))
	mib := make([]float64, len(sets))
	defer func() {
		for _, dir := range dirs {
			if dir != "" {
				os.RemoveAll(dir)
			}
		}
	}()
	for i, set := range sets {
		dirs[i] = filepath.Join(a.work, fmt.Sprintf("line-%d", i))
		box.started.Add(1)
		meta, err := capture.Run(ctx, a.sb.Runtime, a.sb.CaptureRequest(config.PackageSet{ID: "analyze", Imports: set}, dirs[i], a.work, version, a.sb.Config.Runsc.CheckpointOptions))
		if err != nil {
			return restoreLine{}, nil, nil, fmt.Errorf("restore line: %w", err)
		}
		mib[i] = float64(meta.Bytes()) / (1 << 20)
	}
	restorer := a.sb.Restorer(a.work, a.sb.Config.Timeouts.Restore)
	restores, pooledRuns, own := make([][]float64, len(sets)), make([][]float64, len(sets)), make([][]float64, len(sets))
	var cold []float64
	for round := range a.o.RestoreRuns {
		for i, dir := range dirs {
			if withRestore {
				box.started.Add(1)
				ms, err := restorer.MeasureOnce(ctx, "analyze", dir)
				if err != nil {
					return restoreLine{}, nil, nil, fmt.Errorf("restore line: %w: %s, run %d of %d: %w", measure.ErrMeasure, dir, round+1, a.o.RestoreRuns, err)
				}
				restores[i] = append(restores[i], ms)
			}
			ms, memory, err := box.pooledOnce(ctx, dir, a.sb.RestoreFlags)
			if err != nil {
				return restoreLine{}, nil, nil, fmt.Errorf("pooled line: %s, run %d of %d: %w", dir, round+1, a.o.RestoreRuns, err)
			}
			pooledRuns[i], own[i] = append(pooledRuns[i], ms), append(own[i], float64(memory.Own))
		}
		ms, _, err := box.pooledOnce(ctx, "", nil)
		if err != nil {
			return restoreLine{}, nil, nil, fmt.Errorf("pooled line: run %d of %d: %w", round+1, a.o.RestoreRuns, err)
		}
		cold = append(cold, ms)
	}
	var line restoreLine
	pooled := &pooledLine{ColdStartMs: measure.Summarize(cold).Median}
	memory := &memoryLine{}
	for i := range sets {
		if withRestore {
			line.MiB = append(line.MiB, mib[i])
			line.MedianMs = append(line.MedianMs, measure.Summarize(restores[i]).Median)
		}
		pooled.MiB = append(pooled.MiB, mib[i])
		pooled.MedianMs = append(pooled.MedianMs, measure.Summarize(pooledRuns[i]).Median)
		memory.MiB = append(memory.MiB, mib[i])
		memory.OwnBytes = append(memory.OwnBytes, int64(measure.Summarize(own[i]).Median))
	}
	if err := memory.check(); err != nil {
		return restoreLine{}, nil, nil, err
	}
	return line, pooled, memory, nil
}
