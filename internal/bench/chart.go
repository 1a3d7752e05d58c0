package bench

import (
	"fmt"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// medianSpread is a series' medians with error bars from min to max.
type medianSpread struct {
	plotter.XYs
	plotter.YErrors
}

// WriteChart draws two panels as SVG: per set, the median and min-max spread of the floor,
// cold, restore and prestarted series; and the measure-mode restore median against image size
// with the least-squares line.
func WriteChart(w io.Writer, r *Results) error {
	left := plot.New()
	left.Title.Text = "Time to a ready executor, per package set"
	left.Y.Label.Text = "ms (median, bars min-max)"
	left.Y.Min = 0
	series := []string{Floor, Cold, Restore, Prestarted}
	var names []string
	for _, s := range r.Sets {
		names = append(names, s.ID)
	}
	for k, name := range series {
		var ms medianSpread
		for i, s := range r.Sets {
			st, ok := s.Series[name]
			if !ok {
				continue
			}
			x := float64(i) + (float64(k)-1.5)*0.18
			ms.XYs = append(ms.XYs, plotter.XY{X: x, Y: st.Median})
			ms.YErrors = append(ms.YErrors, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
		}
		if len(ms.XYs) == 0 {
			continue
		}
		points, err := plotter.NewScatter(ms.XYs)
		if err != nil {
			return err
		}
		points.Color = plotutil.Color(k)
		points.Shape = plotutil.Shape(k)
		points.Radius = vg.Points(3.5)
		bars, err := plotter.NewYErrorBars(ms)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(k)
		left.Add(points, bars)
		left.Legend.Add(name, points)
	}
	left.Legend.Top = true
	left.NominalX(names...)
	left.X.Min, left.X.Max = -0.6, float64(len(names))-0.4

	right := plot.New()
	right.Title.Text = "Restore median against image size"
	right.X.Label.Text = "image size (MiB)"
	right.Y.Label.Text = "measure-mode restore, median ms"
	var xy plotter.XYs
	for _, s := range r.Sets {
		if st, ok := s.Series[Measure]; ok {
			xy = append(xy, plotter.XY{X: float64(s.Bytes) / (1 << 20), Y: st.Median})
		}
	}
	if len(xy) > 0 {
		points, err := plotter.NewScatter(xy)
		if err != nil {
			return err
		}
		points.Radius = vg.Points(3.5)
		fit := r.Fit
		line := plotter.NewFunction(func(x float64) float64 { return fit.InterceptMs + fit.AlphaMsPerMiB*x })
		line.Color = plotutil.Color(2)
		right.Add(points, line)
		right.Legend.Add("sets", points)
		right.Legend.Add(fmt.Sprintf("%.2f ms/MiB + %.0f ms", fit.AlphaMsPerMiB, fit.InterceptMs), line)
		right.Legend.Top = true
		right.Legend.Left = true
		right.X.Min = 0
		right.Y.Min = 0
		right.X.Max = xy[len(xy)-1].X*1.15 + 1
		for _, p := range xy {
			right.X.Max = max(right.X.Max, p.X*1.15+1)
			right.Y.Max = max(right.Y.Max, p.Y*1.25)
		}
	}

	canvas := vgsvg.New(vg.Points(900), vg.Points(380))
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(20), PadY: vg.Points(10), PadTop: vg.Points(5), PadBottom: vg.Points(5), PadLeft: vg.Points(5), PadRight: vg.Points(10)}
	plots := [][]*plot.Plot{{left, right}}
	canvases := plot.Align(plots, tiles, draw.New(canvas))
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	_, err := canvas.WriteTo(w)
	return err
}
