package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// box is a rectangle in the picture's coordinates, and what it is of.
type box struct {
	x0, y0, x1, y1 float64
	what           string
}

func (b box) overlaps(o box) bool {
	const slack = 0.5 // boxes that touch do not overlap
	return b.x0 < o.x1-slack && o.x0 < b.x1-slack && b.y0 < o.y1-slack && o.y0 < b.y1-slack
}

// ChartLayout is what CheckChart reads of an SVG chart: the picture's size, every text with
// the box it is estimated to take, every mark's box, and every line's.
type ChartLayout struct {
	Width, Height float64
	Texts         []string
	texts, marks  []box
	lines         []box
}

// ReadChart reads the layout of an SVG drawn by WriteChart: texts (their extents estimated
// from font size and string length, as the layout estimated them), marks (class="mark"
// circles and paths) and lines.
func ReadChart(svg []byte) (*ChartLayout, error) {
	l := &ChartLayout{}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		a := map[string]string{}
		for _, at := range el.Attr {
			a[at.Name.Local] = at.Value
		}
		num := func(name string) float64 {
			v, perr := strconv.ParseFloat(a[name], 64)
			if perr != nil && err == nil {
				err = fmt.Errorf("chart: <%s> without a number in %s=%q", el.Name.Local, name, a[name])
			}
			return v
		}
		switch el.Name.Local {
		case "svg":
			l.Width, l.Height = num("width"), num("height")
			if a["transform"] != "" {
				return nil, errors.New("chart: a transform, which this reader does not follow")
			}
		case "text":
			var content string
			if derr := dec.DecodeElement(&content, &el); derr != nil {
				return nil, fmt.Errorf("chart: %w", derr)
			}
			x, y, size := num("x"), num("y"), num("font-size")
			w := textWidth(content, size, a["font-weight"] == "bold")
			switch a["text-anchor"] {
			case "middle":
				x -= w / 2
			case "end":
				x -= w
			}
			l.Texts = append(l.Texts, content)
			l.texts = append(l.texts, box{x, y - textAscent*size, x + w, y + textDescent*size, fmt.Sprintf("text %q", content)})
		case "circle":
			x, y, r := num("cx"), num("cy"), num("r")
			if a["class"] == "mark" {
				l.marks = append(l.marks, box{x - r, y - r, x + r, y + r, fmt.Sprintf("mark at (%.0f, %.0f)", x, y)})
			}
		case "path":
			b, perr := pathBox(a["d"])
			if perr != nil {
				return nil, perr
			}
			if a["class"] == "mark" {
				l.marks = append(l.marks, b)
			} else {
				l.lines = append(l.lines, b)
			}
		case "line":
			l.lines = append(l.lines, box{min(num("x1"), num("x2")), min(num("y1"), num("y2")), max(num("x1"), num("x2")), max(num("y1"), num("y2")), "line"})
		case "rect", "polyline":
			if el.Name.Local == "rect" {
				l.lines = append(l.lines, box{num("x"), num("y"), num("x") + num("width"), num("y") + num("height"), "rect"})
				break
			}
			b, perr := pathBox(strings.ReplaceAll(a["points"], ",", " "))
			if perr != nil {
				return nil, perr
			}
			l.lines = append(l.lines, b)
		}
		if a["transform"] != "" {
			return nil, fmt.Errorf("chart: <%s> has a transform, which this reader does not follow", el.Name.Local)
		}
		if err != nil {
			return nil, err
		}
	}
	if l.Width <= 0 || l.Height <= 0 {
		return nil, errors.New("chart: no <svg> with a width and a height")
	}
	return l, nil
}

// pathBox is the box of a path of absolute moves and lines ("M x y L x y ... Z"), or of a
// polyline's points.
func pathBox(d string) (box, error) {
	fields := strings.FieldsFunc(d, func(r rune) bool { return r == ' ' || r == 'M' || r == 'L' || r == 'Z' })
	if len(fields) == 0 || len(fields)%2 != 0 {
		return box{}, fmt.Errorf("chart: a path this reader cannot follow: %q", d)
	}
	b := box{x0: 1e18, y0: 1e18, x1: -1e18, y1: -1e18}
	for i := 0; i < len(fields); i += 2 {
		x, errX := strconv.ParseFloat(fields[i], 64)
		y, errY := strconv.ParseFloat(fields[i+1], 64)
		if errX != nil || errY != nil {
			return box{}, fmt.Errorf("chart: a path this reader cannot follow: %q", d)
		}
		b.x0, b.y0, b.x1, b.y1 = min(b.x0, x), min(b.y0, y), max(b.x1, x), max(b.y1, y)
	}
	b.what = fmt.Sprintf("mark at (%.0f, %.0f)", (b.x0+b.x1)/2, (b.y0+b.y1)/2)
	return b, nil
}

// CheckChart reads an SVG chart and returns every fault of its layout: a text that overlaps
// another text or a mark, anything outside the picture, and each of names (the series of
// bench.json) that no text of the picture names.
func CheckChart(svg []byte, names []string) error {
	l, err := ReadChart(svg)
	if err != nil {
		return err
	}
	var errs []error
	inside := func(b box) bool { return b.x0 >= 0 && b.y0 >= 0 && b.x1 <= l.Width && b.y1 <= l.Height }
	for _, group := range [][]box{l.texts, l.marks, l.lines} {
		for _, b := range group {
			if !inside(b) {
				errs = append(errs, fmt.Errorf("%s (%.0f,%.0f)-(%.0f,%.0f) is not inside the picture (%.0f x %.0f)", b.what, b.x0, b.y0, b.x1, b.y1, l.Width, l.Height))
			}
		}
	}
	for i, t := range l.texts {
		for _, o := range l.texts[i+1:] {
			if t.overlaps(o) {
				errs = append(errs, fmt.Errorf("%s overlaps %s", t.what, o.what))
			}
		}
		for _, m := range l.marks {
			if t.overlaps(m) {
				errs = append(errs, fmt.Errorf("%s overlaps the %s", t.what, m.what))
			}
		}
	}
	for _, name := range names {
		found := false
		for _, t := range l.Texts {
			if t == name {
				found = true
				break
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("the series %q is named nowhere in the picture", name))
		}
	}
	return errors.Join(errs...)
}
