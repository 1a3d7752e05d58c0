package bench

import (
	"fmt"
	"io"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"readie.dev/pipeline/pkg/manifest"
)

const (
	chartWidth  = 1350
	chartHeight = 420
	// legendLine is the height of one legend entry, in points, with the default font.
	legendLine = 13
)

// spread is a series' medians with error bars from min to max.
type spread struct {
	plotter.XYs
	plotter.YErrors
}

func (s *spread) add(x float64, st manifest.Stats) {
	s.XYs = append(s.XYs, plotter.XY{X: x, Y: st.Median})
	s.YErrors = append(s.YErrors, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
}

// top returns the highest point a spread reaches.
func (s *spread) top() float64 {
	var y float64
	for i, p := range s.XYs {
		y = max(y, p.Y+s.YErrors[i].High)
	}
	return y
}

// addSpread draws s as points with min-max bars in colour k and names it in the legend.
func addSpread(p *plot.Plot, s *spread, k int, name string) error {
	points, err := plotter.NewScatter(s.XYs)
	if err != nil {
		return err
	}
	points.Color, points.Shape, points.Radius = plotutil.Color(k), plotutil.Shape(k), vg.Points(3.5)
	bars, err := plotter.NewYErrorBars(s)
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(k)
	p.Add(points, bars)
	p.Legend.Add(name, points)
	return nil
}

// roomForLegend sets the Y range so that the legend, at the top, never covers a point: every
// point stays below the band its entries take.
func roomForLegend(p *plot.Plot, entries int, top float64) {
	plotHeight := float64(chartHeight) - 90 // title, axis labels and ticks
	band := float64(entries*legendLine+10) / plotHeight
	p.Y.Min = 0
	p.Y.Max = top / (1 - band) * 1.02
	p.Legend.Top = true
}

// WriteChart draws three panels as SVG: per set, the median and min-max of the floor, cold,
// restore and prestarted series; the measure-mode restore against image size with the cost
// model (and its R²); and, when measured, restores at once of the largest set, per series
// (the third panel is left out without them).
func WriteChart(w io.Writer, r *Results, conc []Concurrent) error {
	left, err := setsPanel(r)
	if err != nil {
		return err
	}
	middle, err := sizePanel(r)
	if err != nil {
		return err
	}
	row := []*plot.Plot{left, middle}
	if len(conc) > 0 {
		right, err := concurrencyPanel(conc)
		if err != nil {
			return err
		}
		row = append(row, right)
	}
	width := chartWidth * len(row) / 3
	canvas := vgsvg.New(vg.Points(float64(width)), vg.Points(chartHeight))
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Points(20), PadY: vg.Points(10), PadTop: vg.Points(5), PadBottom: vg.Points(5), PadLeft: vg.Points(5), PadRight: vg.Points(10)}
	plots := [][]*plot.Plot{row}
	canvases := plot.Align(plots, tiles, draw.New(canvas))
	for i, p := range plots[0] {
		p.Draw(canvases[0][i])
	}
	_, err = canvas.WriteTo(w)
	return err
}

// setsPanel plots the time to a ready executor of each series, set by set.
func setsPanel(r *Results) (*plot.Plot, error) {
	left := plot.New()
	left.Title.Text = "Time to a ready executor, per package set"
	left.Y.Label.Text = "ms (median, bars min-max)"
	var names []string
	for _, s := range r.Sets {
		names = append(names, s.ID)
	}
	var top float64
	series := []string{Floor, Cold, Restore, Prestarted, Pooled}
	for k, name := range series {
		var s spread
		for i, set := range r.Sets {
			if st, ok := set.Series[name]; ok {
				s.add(float64(i)+(float64(k)-2)*0.15, st)
			}
		}
		if len(s.XYs) == 0 {
			continue
		}
		if err := addSpread(left, &s, k, name); err != nil {
			return nil, err
		}
		top = max(top, s.top())
	}
	roomForLegend(left, len(series), top)
	left.NominalX(names...)
	left.X.Min, left.X.Max = -0.6, float64(len(names))-0.4
	return left, nil
}

// sizePanel plots the measure-mode restore against image size, with the fitted cost model.
func sizePanel(r *Results) (*plot.Plot, error) {
	middle := plot.New()
	middle.Title.Text = "Restore against image size"
	middle.X.Label.Text = "image size (MiB)"
	middle.Y.Label.Text = "measure-mode restore, ms (median, bars min-max)"
	var sizes spread
	for _, s := range r.Sets {
		if st, ok := s.Series[Measure]; ok {
			sizes.add(float64(s.Bytes)/(1<<20), st)
		}
	}
	if len(sizes.XYs) == 0 {
		return middle, nil
	}
	if err := addSpread(middle, &sizes, 0, "sets"); err != nil {
		return nil, err
	}
	fit := r.Fit
	if fit.Fitted() {
		line := plotter.NewFunction(func(x float64) float64 { return fit.InterceptMs + fit.AlphaMsPerMiB*x })
		line.Color = plotutil.Color(2)
		middle.Add(line)
		middle.Legend.Add(fit.Describe(), line)
	} else {
		middle.Title.Text += " (one size: no cost model)"
	}
	middle.Legend.Left = true
	middle.X.Min = 0
	for _, p := range sizes.XYs {
		middle.X.Max = max(middle.X.Max, p.X*1.1+1)
	}
	roomForLegend(middle, 2, sizes.top())
	return middle, nil
}

// concurrencyPanel plots the time to each answer against the restores started together.
func concurrencyPanel(conc []Concurrent) (*plot.Plot, error) {
	right := plot.New()
	right.Title.Text = "Restores at once"
	right.X.Label.Text = "restores started together"
	right.Y.Label.Text = "ms to each answer (median, bars min-max)"
	var bySeries []string
	for _, c := range conc {
		if len(bySeries) == 0 || bySeries[len(bySeries)-1] != c.Series {
			bySeries = append(bySeries, c.Series)
		}
	}
	var top float64
	for k, name := range bySeries {
		var s spread
		for _, c := range conc {
			if c.Series == name {
				s.add(float64(c.Concurrency)+(float64(k)-float64(len(bySeries)-1)/2)*0.08, c.Latency)
			}
		}
		if err := addSpread(right, &s, k, name); err != nil {
			return nil, err
		}
		top = max(top, s.top())
	}
	roomForLegend(right, len(bySeries), top)
	right.X.Min = 0.5
	var ticks []plot.Tick
	for _, c := range conc {
		right.X.Max = max(right.X.Max, float64(c.Concurrency)+0.5)
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(c.Concurrency) }) {
			ticks = append(ticks, plot.Tick{Value: float64(c.Concurrency), Label: fmt.Sprint(c.Concurrency)})
		}
	}
	right.X.Tick.Marker = plot.ConstantTicks(ticks)
	return right, nil
}
