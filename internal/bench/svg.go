package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
	"unicode"
)

// The bench's charts are drawn by hand as plain SVG, with no transform and every element in
// absolute coordinates, so that where each text and mark lands is known exactly: the layout
// places legends and labels where they cannot meet a mark, and CheckChart reads the file back
// to prove it.

const (
	chartFont  = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
	titleSize  = 14.0
	labelSize  = 11.0
	tickSize   = 10.0
	markRadius = 4.0
	// ascent and descent of a line of text, in ems, from its baseline: generous, as the
	// width is.
	textAscent  = 0.8
	textDescent = 0.25
)

// textWidth estimates the width of s at size (in px) from its characters: an upper bound for
// the sans-serif fonts a renderer picks (DejaVu Sans's digits are 0.64 em, Arial's 0.56).
func textWidth(s string, size float64, bold bool) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("il.,:;'|!", r):
			w += 0.34
		case strings.ContainsRune("fjtr-()[] /", r):
			w += 0.45
		case strings.ContainsRune("mwMW%@", r):
			w += 1.0
		case unicode.IsUpper(r):
			w += 0.76
		default:
			w += 0.66
		}
	}
	if bold {
		w *= 1.12
	}
	return w * size
}

// seriesStyle tells a series apart in colour and, for grey prints, in marker shape and dash.
type seriesStyle struct {
	color string
	shape int
	dash  string
}

// Okabe and Ito's colour-blind safe palette, yellow replaced by a brown (too pale on white).
var palette = [...]string{"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#8C564B"}

var dashes = [...]string{"", "6 3", "2 2", "8 3 2 3", "1 3", "10 4"}

const shapes = 7 // circle, square, triangle up, diamond, triangle down, plus, cross

// styleOf is the k-th series' style: 8 colours and 7 shapes, coprime, give 56 distinct pairs.
func styleOf(k int) seriesStyle {
	return seriesStyle{color: palette[k%len(palette)], shape: k % shapes, dash: dashes[k%len(dashes)]}
}

// svgCanvas collects the elements of one picture; its height grows as panels are drawn.
type svgCanvas struct {
	b      strings.Builder
	width  float64
	height float64
}

func (c *svgCanvas) text(x, y, size float64, anchor string, bold bool, s string) {
	weight := ""
	if bold {
		weight = ` font-weight="bold"`
	}
	fmt.Fprintf(&c.b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\" text-anchor=\"%s\"%s>%s</text>\n", x, y, size, anchor, weight, html.EscapeString(s))
}

func (c *svgCanvas) line(x1, y1, x2, y2 float64, stroke string, width float64, dash string) {
	d := ""
	if dash != "" {
		d = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(&c.b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%g\"%s/>\n", x1, y1, x2, y2, stroke, width, d)
}

func (c *svgCanvas) polyline(points [][2]float64, stroke string, width float64, dash string) {
	var pts []string
	for _, p := range points {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", p[0], p[1]))
	}
	d := ""
	if dash != "" {
		d = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(&c.b, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%g\"%s/>\n", strings.Join(pts, " "), stroke, width, d)
}

func (c *svgCanvas) rect(x, y, w, h float64, fill, stroke string, opacity float64) {
	fmt.Fprintf(&c.b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"%g\" stroke=\"%s\"/>\n", x, y, w, h, fill, opacity, stroke)
}

// mark draws a data marker of shape centred on (x, y), of radius r. Every mark is a
// class="mark" circle or a path of absolute moves and lines, which CheckChart measures.
func (c *svgCanvas) mark(shape int, x, y, r float64, fill string) {
	if shape == ringShape {
		fmt.Fprintf(&c.b, "<circle class=\"mark\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", x, y, r, fill)
		return
	}
	if shape == 0 {
		fmt.Fprintf(&c.b, "<circle class=\"mark\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\" stroke=\"#ffffff\" stroke-width=\"0.6\"/>\n", x, y, r, fill)
		return
	}
	var pts [][2]float64
	switch shape {
	case 1: // square
		s := r * 0.85
		pts = [][2]float64{{-s, -s}, {s, -s}, {s, s}, {-s, s}}
	case 2: // triangle up
		pts = [][2]float64{{0, -r}, {r, r * 0.8}, {-r, r * 0.8}}
	case 3: // diamond
		pts = [][2]float64{{0, -r}, {r, 0}, {0, r}, {-r, 0}}
	case 4: // triangle down
		pts = [][2]float64{{0, r}, {r, -r * 0.8}, {-r, -r * 0.8}}
	case 5, 6: // plus, and the same turned 45°
		a := r * 0.35
		pts = [][2]float64{{-a, -r}, {a, -r}, {a, -a}, {r, -a}, {r, a}, {a, a}, {a, r}, {-a, r}, {-a, a}, {-r, a}, {-r, -a}, {-a, -a}}
		if shape == 6 {
			for i, p := range pts {
				pts[i] = [2]float64{(p[0] - p[1]) / math.Sqrt2, (p[0] + p[1]) / math.Sqrt2}
			}
		}
	case 7: // a thin upright bar: a percentile's tick
		w := r * 0.25
		pts = [][2]float64{{-w, -r}, {w, -r}, {w, r}, {-w, r}}
	}
	var d strings.Builder
	for i, p := range pts {
		cmd := "L"
		if i == 0 {
			cmd = "M"
		}
		fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x+p[0], y+p[1])
	}
	d.WriteString("Z")
	fmt.Fprintf(&c.b, "<path class=\"mark\" d=\"%s\" fill=\"%s\" stroke=\"#ffffff\" stroke-width=\"0.6\"/>\n", d.String(), fill)
}

// barShape and ringShape are mark's shapes for percentiles (p90, p99), unlike any series'.
const (
	barShape  = 7
	ringShape = 8
)

func (c *svgCanvas) bytes() []byte {
	var out strings.Builder
	fmt.Fprintf(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\">\n",
		c.width, c.height, c.width, c.height, chartFont)
	fmt.Fprintf(&out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", c.width, c.height)
	out.WriteString(c.b.String())
	out.WriteString("</svg>\n")
	return []byte(out.String())
}

// legendEntry is one entry of a legend: a glyph then its name.
type legendEntry struct {
	name string
	// draw draws the glyph in the box of width glyphWidth whose left middle is (x, y).
	draw       func(c *svgCanvas, x, y float64)
	glyphWidth float64
}

// seriesEntry is a series' legend entry: its marker, on a sample of its line when withLine.
func seriesEntry(name string, st seriesStyle, withLine bool) legendEntry {
	if withLine {
		return legendEntry{name: name, glyphWidth: 22, draw: func(c *svgCanvas, x, y float64) {
			c.line(x, y, x+22, y, st.color, 1.5, st.dash)
			c.mark(st.shape, x+11, y, markRadius, st.color)
		}}
	}
	return legendEntry{name: name, glyphWidth: 2 * markRadius, draw: func(c *svgCanvas, x, y float64) {
		c.mark(st.shape, x+markRadius, y, markRadius, st.color)
	}}
}

const legendRow = 17.0

// legend lays entries out in rows from (x0, y0) within width, each entry its glyph then its
// name, and returns the height taken.
func (c *svgCanvas) legend(x0, y0, width float64, entries []legendEntry) float64 {
	if len(entries) == 0 {
		return 0
	}
	x, y := x0, y0+legendRow/2
	for _, e := range entries {
		w := e.glyphWidth + 5 + textWidth(e.name, labelSize, false)
		if x > x0 && x+w > x0+width {
			x, y = x0, y+legendRow
		}
		e.draw(c, x, y)
		c.text(x+e.glyphWidth+5, baseline(y, labelSize), labelSize, "start", false, e.name)
		x += w + 16
	}
	return y + legendRow/2 - y0
}

// baseline is the baseline that centres a line of text of size on y.
func baseline(y, size float64) float64 { return y + (textAscent-textDescent)/2*size }

// linear maps [lo, hi] onto the pixels [px0, px1].
type linear struct{ lo, hi, px0, px1 float64 }

func (s linear) at(v float64) float64 { return s.px0 + (v-s.lo)/(s.hi-s.lo)*(s.px1-s.px0) }

// niceTicks returns about n round ticks covering [lo, hi], the first at or below lo, the last
// at or above hi.
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []float64
	for v := math.Floor(lo/step) * step; ; v += step {
		ticks = append(ticks, v)
		if v >= hi-step*1e-9 {
			return ticks
		}
	}
}

// tickLabel formats a tick value without needless decimals.
func tickLabel(v float64) string {
	if math.Abs(v-math.Round(v)) < 1e-9 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// yAxis draws the ticks of a value axis from top to bottom at the left of the plot area, with
// light grid lines across it to right.
func (c *svgCanvas) yAxis(s linear, ticks []float64, left, right float64) {
	for _, t := range ticks {
		y := s.at(t)
		c.line(left, y, right, y, "#e5e5e5", 1, "")
		c.text(left-5, baseline(y, tickSize), tickSize, "end", false, tickLabel(t))
	}
	c.line(left, s.px0, left, s.px1, "#333333", 1, "")
}

// tickColumn is the width the labels of ticks take.
func tickColumn(ticks []float64) float64 {
	w := 0.0
	for _, t := range ticks {
		w = max(w, textWidth(tickLabel(t), tickSize, false))
	}
	return w + 8
}

// fitText cuts s so that it fits in width at size, ending it with an ellipsis if cut.
func fitText(s string, size, width float64) string {
	if textWidth(s, size, false) <= width {
		return s
	}
	r := []rune(s)
	for len(r) > 1 && textWidth(string(r)+"…", size, false) > width {
		r = r[:len(r)-1]
	}
	return string(r) + "…"
}
