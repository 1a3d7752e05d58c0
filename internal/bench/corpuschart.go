package bench

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"readie.dev/pipeline/pkg/manifest"
)

// The corpus chart (WriteCorpusChart) is drawn with gonum/plot; these are its helpers.

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
