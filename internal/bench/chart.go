package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
)

const (
	svgWidth  = 1000.0
	margin    = 14.0
	plotH     = 250.0
	rowHeight = 16.0
	panelGap  = 26.0
)

// WriteChart draws bench.svg, one panel per question, stacked: the time to a ready executor
// per set and series; the distribution of each series (p50, p90, p99); restore against image
// size with the cost model; restores at once. A panel with no data is left out. Every series
// has one style (colour, marker shape, dash) in every panel, by its place in r.Series, and its
// name is written in the picture; legends sit above the plot areas and labels beside them, so
// that no text meets a mark (CheckChart).
func WriteChart(w io.Writer, r *Results, conc []Concurrent) error {
	c := &svgCanvas{width: svgWidth, height: margin}
	styles := map[string]seriesStyle{}
	for k, name := range r.Series {
		styles[name] = styleOf(k)
	}
	for _, c := range conc { // a series measured only at once still gets its own style
		if _, ok := styles[c.Series]; !ok {
			styles[c.Series] = styleOf(len(styles))
		}
	}
	series := seriesWithData(r)
	drawn := 0
	for _, panel := range []func(*svgCanvas) bool{
		func(c *svgCanvas) bool { return setsPanel(c, r, series, styles) },
		func(c *svgCanvas) bool { return distributionPanel(c, r, series, styles) },
		func(c *svgCanvas) bool { return sizePanel(c, r, styles[Measure]) },
		func(c *svgCanvas) bool { return concurrencyPanel(c, conc, styles) },
	} {
		if drawn > 0 {
			c.height += panelGap
		}
		if panel(c) {
			drawn++
		} else if drawn > 0 {
			c.height -= panelGap
		}
	}
	if drawn == 0 {
		c.text(margin, c.height+titleSize, titleSize, "start", true, "No figures measured")
		c.height += titleSize + 6
	}
	c.height += margin
	_, err := w.Write(c.bytes())
	return err
}

// seriesWithData returns r.Series that some set measured, in order.
func seriesWithData(r *Results) []string {
	var out []string
	for _, name := range r.Series {
		if slices.ContainsFunc(r.Sets, func(s SetReport) bool { return len(s.Series[name].Runs) > 0 }) {
			out = append(out, name)
		}
	}
	return out
}

// heading writes a panel's title and the line that says how to read it, and returns the y
// below them.
func heading(c *svgCanvas, title, how string) float64 {
	y := c.height
	c.text(margin, y+titleSize, titleSize, "start", true, fitText(title, titleSize*1.12, svgWidth-2*margin))
	y += titleSize + 6
	if how != "" {
		c.text(margin, y+labelSize, labelSize, "start", false, fitText(how, labelSize, svgWidth-2*margin))
		y += labelSize + 8
	}
	return y
}

// setsPanel: per set, a column per series, marker at p50 with a bar from p25 to p75.
func setsPanel(c *svgCanvas, r *Results, series []string, styles map[string]seriesStyle) bool {
	if len(series) == 0 {
		return false
	}
	y := heading(c, "Time to a ready executor, per package set and series",
		"ms; marker: p50 (median), bar: p25-p75 (the spread, the middle half of the runs); the distributions are below")
	var entries []legendEntry
	for _, name := range series {
		entries = append(entries, seriesEntry(name, styles[name], false))
	}
	y += c.legend(margin, y, svgWidth-2*margin, entries) + 10
	top := 0.0
	for _, s := range r.Sets {
		for _, st := range s.Series {
			if len(st.Runs) > 0 {
				top = max(top, st.P75)
			}
		}
	}
	ticks := niceTicks(0, top, 6)
	left, right := margin+tickColumn(ticks), svgWidth-margin
	ys := linear{ticks[0], ticks[len(ticks)-1], y + plotH, y}
	c.yAxis(ys, ticks, left, right)
	group := (right - left) / float64(len(r.Sets))
	slot := group * 0.86 / float64(len(series))
	for i, set := range r.Sets {
		x0 := left + group*float64(i) + group*0.07
		if i > 0 {
			c.line(left+group*float64(i), y, left+group*float64(i), y+plotH, "#cccccc", 1, "4 3")
		}
		for k, name := range series {
			st, ok := set.Series[name]
			if !ok || len(st.Runs) == 0 {
				continue
			}
			x := x0 + slot*(float64(k)+0.5)
			sty := styles[name]
			c.line(x, ys.at(st.P25), x, ys.at(st.P75), sty.color, 2, "")
			c.mark(sty.shape, x, ys.at(st.P50), markRadius, sty.color)
		}
		mid := left + group*(float64(i)+0.5)
		c.text(mid, y+plotH+4+labelSize, labelSize, "middle", false, fitText(set.ID, labelSize, group-6))
		c.text(mid, y+plotH+8+2*labelSize, tickSize, "middle", false, fitText(fmt.Sprintf("%.1f MiB", float64(set.Bytes)/(1<<20)), tickSize, group-6))
	}
	c.line(left, y+plotH, right, y+plotH, "#333333", 1, "")
	c.height = y + plotH + 12 + 2*labelSize
	return true
}

// distributionPanel: per set, a row per series: whisker from min to max, box from p25 to p75,
// the series' marker at p50, a bar at p90 and a ring at p99.
func distributionPanel(c *svgCanvas, r *Results, series []string, styles map[string]seriesStyle) bool {
	if len(series) == 0 {
		return false
	}
	y := heading(c, "Distribution of each series, per package set", "ms; line: min-max, box: p25-p75, marker: p50")
	grey := "#555555"
	key := []legendEntry{
		{name: "p90", glyphWidth: 2 * markRadius, draw: func(c *svgCanvas, x, y float64) { c.mark(barShape, x+markRadius, y, markRadius*1.3, grey) }},
		{name: "p99", glyphWidth: 2 * markRadius, draw: func(c *svgCanvas, x, y float64) { c.mark(ringShape, x+markRadius, y, markRadius, grey) }},
	}
	y += c.legend(margin, y, svgWidth-2*margin, key) + 8
	labels := 0.0
	top := 0.0
	for _, name := range series {
		labels = max(labels, textWidth(name, labelSize, false))
	}
	for _, s := range r.Sets {
		for _, st := range s.Series {
			if len(st.Runs) > 0 {
				top = max(top, st.Max)
			}
		}
	}
	ticks := niceTicks(0, top, 8)
	// The last tick's label is centred on the right edge of the plot: room for its half.
	left, right := margin+2*markRadius+5+labels+12, svgWidth-margin-textWidth(tickLabel(ticks[len(ticks)-1]), tickSize, false)/2
	xs := linear{ticks[0], ticks[len(ticks)-1], left, right}
	plotTop := y
	var rows []func()
	for _, set := range r.Sets {
		c.text(margin, y+labelSize, labelSize, "start", true, fmt.Sprintf("%s (%.1f MiB)", set.ID, float64(set.Bytes)/(1<<20)))
		y += labelSize + 6
		for _, name := range series {
			st, ok := set.Series[name]
			if !ok || len(st.Runs) == 0 {
				continue
			}
			cy, sty := y+rowHeight/2, styles[name]
			c.mark(sty.shape, margin+markRadius, cy, markRadius, sty.color)
			c.text(margin+2*markRadius+5, baseline(cy, labelSize), labelSize, "start", false, name)
			rows = append(rows, func() { // drawn over the grid lines
				c.line(xs.at(st.Min), cy, xs.at(st.Max), cy, sty.color, 1, "")
				c.rect(xs.at(st.P25), cy-4, max(xs.at(st.P75)-xs.at(st.P25), 1), 8, sty.color, sty.color, 0.3)
				c.mark(barShape, xs.at(st.P90), cy, markRadius*1.3, grey)
				c.mark(ringShape, xs.at(st.P99), cy, markRadius, grey)
				c.mark(sty.shape, xs.at(st.P50), cy, markRadius, sty.color)
			})
			y += rowHeight
		}
		y += 4
	}
	for _, t := range ticks {
		c.line(xs.at(t), plotTop, xs.at(t), y, "#e5e5e5", 1, "")
		c.text(xs.at(t), y+4+tickSize, tickSize, "middle", false, tickLabel(t))
	}
	c.line(left, y, right, y, "#333333", 1, "")
	for _, row := range rows {
		row()
	}
	c.height = y + 6 + tickSize
	return true
}

// sizePanel: the measure-mode restore (p50, bar p25-p75) against image size, the cost model's
// line, each point labelled with its set in a column beside the plot.
func sizePanel(c *svgCanvas, r *Results, sty seriesStyle) bool {
	type point struct {
		set     string
		mib     float64
		st      Stats
		px, py  float64
		labelAt float64
	}
	var pts []point
	for _, s := range r.Sets {
		if st, ok := s.Series[Measure]; ok && len(st.Runs) > 0 {
			pts = append(pts, point{set: s.ID, mib: float64(s.Bytes) / (1 << 20), st: st})
		}
	}
	if len(pts) == 0 {
		return false
	}
	title := "Restore against image size"
	fit := r.Fit
	if !fit.Fitted() {
		title += " (one size: no cost model)"
	}
	y := heading(c, title, "ms to the end of a measure-mode restore against image size (MiB); marker: p50, bar: p25-p75")
	entries := []legendEntry{seriesEntry(Measure, sty, false)}
	line := func(x float64) float64 { return fit.InterceptMs + fit.AlphaMsPerMiB*x }
	if fit.Fitted() {
		entries = append(entries, legendEntry{name: "cost model: " + fit.Describe(), glyphWidth: 22, draw: func(c *svgCanvas, x, y float64) {
			c.line(x, y, x+22, y, "#555555", 1.5, "6 3")
		}})
	}
	y += c.legend(margin, y, svgWidth-2*margin, entries) + 10
	xTop, yTop, yLow := 0.0, 0.0, 0.0
	labels := 0.0
	for _, p := range pts {
		xTop, yTop = max(xTop, p.mib), max(yTop, p.st.P75)
		labels = max(labels, textWidth(p.set, labelSize, false))
	}
	xticks := niceTicks(0, xTop*1.05, 8)
	if fit.Fitted() {
		x1 := xticks[len(xticks)-1]
		yTop, yLow = max(yTop, line(0), line(x1)), min(yLow, line(0), line(x1))
	}
	yticks := niceTicks(yLow, yTop, 6)
	height := max(plotH, float64(len(pts))*(labelSize+3)+10)
	left, right := margin+tickColumn(yticks), svgWidth-margin-max(labels+24, textWidth(tickLabel(xticks[len(xticks)-1]), tickSize, false)/2)
	xs := linear{xticks[0], xticks[len(xticks)-1], left, right}
	ys := linear{yticks[0], yticks[len(yticks)-1], y + height, y}
	c.yAxis(ys, yticks, left, right)
	for _, t := range xticks {
		c.line(xs.at(t), y+height, xs.at(t), y+height+4, "#333333", 1, "")
		c.text(xs.at(t), y+height+6+tickSize, tickSize, "middle", false, tickLabel(t))
	}
	c.line(left, y+height, right, y+height, "#333333", 1, "")
	c.text((left+right)/2, y+height+10+tickSize+labelSize, labelSize, "middle", false, "image size, MiB")
	if fit.Fitted() {
		x1 := xticks[len(xticks)-1]
		c.line(xs.at(0), ys.at(line(0)), xs.at(x1), ys.at(line(x1)), "#555555", 1.5, "6 3")
	}
	for i := range pts {
		pts[i].px, pts[i].py = xs.at(pts[i].mib), ys.at(pts[i].st.P50)
	}
	// Labels in a column right of the plot, in the points' order from the top, at least a
	// line apart, each joined to its point by a leader line.
	slices.SortStableFunc(pts, func(a, b point) int { return cmp.Compare(a.py, b.py) })
	gap := labelSize + 3
	for i := range pts {
		pts[i].labelAt = max(pts[i].py, y+gap/2)
		if i > 0 {
			pts[i].labelAt = max(pts[i].labelAt, pts[i-1].labelAt+gap)
		}
	}
	if over := pts[len(pts)-1].labelAt - (y + height - gap/2); over > 0 {
		for i := range pts {
			pts[i].labelAt -= over
		}
	}
	for _, p := range pts {
		c.line(p.px+markRadius+1, p.py, right+8, p.labelAt, "#999999", 0.7, "")
		c.text(right+12, baseline(p.labelAt, labelSize), labelSize, "start", false, p.set)
	}
	for _, p := range pts {
		c.line(p.px, ys.at(p.st.P25), p.px, ys.at(p.st.P75), sty.color, 2, "")
		c.mark(sty.shape, p.px, p.py, markRadius, sty.color)
	}
	c.height = y + height + 14 + tickSize + labelSize
	return true
}

// concurrencyPanel: the time from the release to each answer (p50, bar p25-p75) against the
// number of restores started together, a line per series.
func concurrencyPanel(c *svgCanvas, conc []Concurrent, styles map[string]seriesStyle) bool {
	if len(conc) == 0 {
		return false
	}
	var series []string
	var ks []int
	top := 0.0
	for _, x := range conc {
		if !slices.Contains(series, x.Series) {
			series = append(series, x.Series)
		}
		if !slices.Contains(ks, x.Concurrency) {
			ks = append(ks, x.Concurrency)
		}
		top = max(top, x.Latency.P75)
	}
	slices.Sort(ks)
	y := heading(c, "Restores at once, of "+conc[0].Set,
		"ms from the release of the restores started together to each answer; marker: p50, bar: p25-p75")
	var entries []legendEntry
	for _, name := range series {
		entries = append(entries, seriesEntry(name, styles[name], true))
	}
	y += c.legend(margin, y, svgWidth-2*margin, entries) + 10
	ticks := niceTicks(0, top, 6)
	left, right := margin+tickColumn(ticks), svgWidth-margin
	ys := linear{ticks[0], ticks[len(ticks)-1], y + plotH, y}
	c.yAxis(ys, ticks, left, right)
	// The numbers at once are categories, equally spaced: 1, 2, 4 and 16 all readable.
	slot := linear{-0.5, float64(len(ks)) - 0.5, left, right}
	at := func(k int) float64 { return slot.at(float64(slices.Index(ks, k))) }
	for _, k := range ks {
		c.line(at(k), y+plotH, at(k), y+plotH+4, "#333333", 1, "")
		c.text(at(k), y+plotH+6+tickSize, tickSize, "middle", false, fmt.Sprint(k))
	}
	c.line(left, y+plotH, right, y+plotH, "#333333", 1, "")
	c.text((left+right)/2, y+plotH+10+tickSize+labelSize, labelSize, "middle", false, "restores started together")
	// Series side by side around each K, no further apart than a tenth of one step.
	spreadPx := min((slot.at(1)-slot.at(0))*0.5, 10*float64(len(series)))
	for i, name := range series {
		sty := styles[name]
		dx := 0.0
		if len(series) > 1 {
			dx = spreadPx * (float64(i)/float64(len(series)-1) - 0.5)
		}
		var line [][2]float64
		for _, x := range conc {
			if x.Series == name {
				line = append(line, [2]float64{at(x.Concurrency) + dx, ys.at(x.Latency.P50)})
			}
		}
		slices.SortFunc(line, func(a, b [2]float64) int { return cmp.Compare(a[0], b[0]) })
		if len(line) > 1 {
			c.polyline(line, sty.color, 1.5, sty.dash)
		}
		for _, x := range conc {
			if x.Series == name {
				px := at(x.Concurrency) + dx
				c.line(px, ys.at(x.Latency.P25), px, ys.at(x.Latency.P75), sty.color, 2, "")
				c.mark(sty.shape, px, ys.at(x.Latency.P50), markRadius, sty.color)
			}
		}
	}
	c.height = y + plotH + 14 + tickSize + labelSize
	return true
}
