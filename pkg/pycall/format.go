package pycall

import (
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	ogorek "github.com/kisielk/og-rek"
)

// ErrorBytes is how much of a decoded value an error message shows (Format).
const ErrorBytes = 512

// formatDepth is how deep Format shows nested containers; deeper ones are "...".
const formatDepth = 100

// truncated ends a text Format cut at its budget.
const truncated = "..."

// Format returns v, a decoded value (Decode's types, og-rek's), as Python's repr shows it, in
// at most maxBytes bytes: a longer text is cut and ends in "...". A container met a second
// time is shown as "...", one inside itself as "<cycle>", one nested deeper than 100 as
// "...", and a value of another type by its Go type alone, so that no value, however built,
// makes it recurse without bound or do work beyond maxBytes and the value's own size (a dict's
// keys are sorted, for the same text every time). It is the way to print a value a reply
// decoded to: %v of it would follow every shared reference and cycle.
func Format(v any, maxBytes int) string {
	p := printer{max: max(maxBytes, 0)}
	p.value(v, 0)
	return p.String()
}

// formatText is like Format, but a string is written as its text, not quoted: newlines and
// tabs are kept and other control characters escaped (a traceback stays readable and cannot
// write to a terminal).
func formatText(v any, maxBytes int) string {
	s, ok := v.(string)
	if !ok {
		return Format(v, maxBytes)
	}
	return Text(s, maxBytes)
}

// Text returns s, text a stranger wrote (an executor's output), in at most maxBytes, safe to
// print: newlines and tabs kept, other control and unprintable characters and invalid UTF-8
// escaped as Python escapes them, so that it cannot move a terminal's cursor, rewrite what is
// shown or reverse the text after it.
func Text(s string, maxBytes int) string {
	p := printer{max: max(maxBytes, 0)}
	p.text(s)
	return p.String()
}

type printer struct {
	buf  []byte
	max  int
	full bool
	// shown holds the containers shown or being shown (open).
	shown map[identity]shownState
}

type shownState uint8

const (
	open shownState = iota + 1
	closed
)

// identity is a map's or a slice's: where its elements are, and for a slice how many.
type identity struct {
	ptr uintptr
	len int
}

// String is the text written, cut to max bytes on a character's boundary and marked when
// something did not fit.
func (p *printer) String() string {
	if !p.full {
		return string(p.buf)
	}
	cut := max(p.max-len(truncated), 0)
	for cut > 0 && !utf8.RuneStart(p.buf[cut]) {
		cut--
	}
	return string(p.buf[:cut]) + truncated[:min(len(truncated), p.max)]
}

func (p *printer) write(s string) {
	if p.full {
		return
	}
	if room := p.max - len(p.buf); len(s) > room {
		p.buf = append(p.buf, s[:room]...)
		p.full = true
		return
	}
	p.buf = append(p.buf, s...)
}

func (p *printer) value(v any, depth int) {
	if p.full {
		return
	}
	switch v := v.(type) {
	case nil, ogorek.None:
		p.write("None")
	case bool:
		if v {
			p.write("True")
		} else {
			p.write("False")
		}
	case int64:
		p.write(strconv.FormatInt(v, 10))
	case *big.Int:
		// Decimal conversion is superlinear: a huge integer is shown by its size.
		if v == nil {
			p.write("None")
		} else if v.BitLen() > 1<<14 {
			p.write("<int of " + strconv.Itoa(v.BitLen()) + " bits>")
		} else {
			p.write(v.String())
		}
	case float64:
		p.write(pyFloat(v))
	case string:
		p.quote(v, "")
	case ogorek.Bytes:
		p.quote(string(v), "b")
	case ogorek.ByteString:
		p.quote(string(v), "b")
	case []byte:
		p.write("bytearray(")
		p.quote(string(v), "b")
		p.write(")")
	case ogorek.Class:
		p.chars(v.Module, false, noSpecial)
		p.write(".")
		p.chars(v.Name, false, noSpecial)
	case []any:
		p.container(v, depth, "[", "]", func() { p.items(v, depth) })
	case ogorek.Tuple:
		p.container([]any(v), depth, "(", ")", func() {
			p.items(v, depth)
			if len(v) == 1 {
				p.write(",")
			}
		})
	case map[any]any:
		p.container(v, depth, "{", "}", func() { p.dict(v, depth) })
	case Object:
		p.object(v, depth)
	case ogorek.Call:
		p.object(Object{Callable: v.Callable, Args: v.Args}, depth)
	default:
		p.other(v)
	}
}

// container writes a list, tuple or dict between start and end, unless it is empty, deeper
// than formatDepth, being written (a cycle) or written before.
func (p *printer) container(v any, depth int, start, end string, items func()) {
	rv := reflect.ValueOf(v)
	if rv.Len() == 0 {
		p.write(start + end)
		return
	}
	id := identity{ptr: rv.Pointer(), len: rv.Len()}
	switch {
	case p.shown[id] == open:
		p.write("<cycle>")
		return
	case p.shown[id] == closed || depth >= formatDepth:
		p.write(start + truncated + end)
		return
	}
	if p.shown == nil {
		p.shown = map[identity]shownState{}
	}
	p.shown[id] = open
	p.write(start)
	items()
	p.write(end)
	p.shown[id] = closed
}

func (p *printer) items(vs []any, depth int) {
	for i, v := range vs {
		if p.full {
			return
		}
		if i > 0 {
			p.write(", ")
		}
		p.value(v, depth+1)
	}
}

// dict writes a dict's items in the order of their keys' text.
func (p *printer) dict(m map[any]any, depth int) {
	type entry struct {
		key string
		val any
	}
	entries := make([]entry, 0, len(m))
	for k, v := range m {
		// Keys are scalars (Decode refuses others); a key of another type shows its type.
		entries = append(entries, entry{Format(k, min(p.max, ErrorBytes)), v})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	for i, e := range entries {
		if p.full {
			return
		}
		if i > 0 {
			p.write(", ")
		}
		p.write(e.key + ": ")
		p.value(e.val, depth+1)
	}
}

// object writes an Object as the call that would build it, then what would be added to it:
// mod.name(args, **kwargs).__setstate__(state) + [list items] + {dict items}.
func (p *printer) object(o Object, depth int) {
	if depth >= formatDepth {
		p.write(truncated)
		return
	}
	p.value(o.Callable, depth+1)
	p.write("(")
	p.items(o.Args, depth)
	if len(o.Kwargs) > 0 {
		if len(o.Args) > 0 {
			p.write(", ")
		}
		p.write("**")
		p.value(o.Kwargs, depth+1)
	}
	p.write(")")
	if o.State != nil {
		p.write(".__setstate__(")
		p.value(o.State, depth+1)
		p.write(")")
	}
	if o.ListItems != nil {
		p.write(" + ")
		p.value(o.ListItems, depth+1)
	}
	if o.DictItems != nil {
		p.write(" + ")
		p.value(o.DictItems, depth+1)
	}
}

// other writes a Go value of a type Decode does not return: a scalar as fmt would, anything
// else by its type, never by walking it.
func (p *printer) other(v any) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Bool:
		p.value(rv.Bool(), 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		p.write(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		p.write(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		p.write(pyFloat(rv.Float()))
	case reflect.String:
		p.quote(rv.String(), "")
	default:
		p.write("<" + rv.Type().String() + ">")
	}
}

// quote writes s as Python's repr of a str (prefix "") or bytes (prefix "b").
func (p *printer) quote(s, prefix string) {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	p.write(prefix + q)
	p.chars(s, prefix == "b", func(r rune) string {
		switch r {
		case '\\':
			return `\\`
		case '\n':
			return `\n`
		case '\r':
			return `\r`
		case '\t':
			return `\t`
		case rune(q[0]):
			return `\` + q
		}
		return ""
	})
	p.write(q)
}

// text writes s as it is, but for control and unprintable characters other than newline and
// tab, escaped.
func (p *printer) text(s string) {
	p.chars(s, false, func(r rune) string {
		if r == '\n' || r == '\t' {
			return string(r)
		}
		return ""
	})
}

func noSpecial(rune) string { return "" }

// chars writes s a character at a time (a byte at a time if asBytes) until the budget is spent:
// special's text for a character if it has one, the character if printable (ASCII only for
// bytes), else Python's escape of it (an invalid UTF-8 byte as \xNN).
func (p *printer) chars(s string, asBytes bool, special func(rune) string) {
	for i := 0; i < len(s) && !p.full; {
		r, size := utf8.DecodeRuneInString(s[i:])
		if asBytes {
			r, size = rune(s[i]), 1
		}
		switch {
		case special(r) != "":
			p.write(special(r))
		case r == utf8.RuneError && size == 1:
			p.write(escape(rune(s[i])))
		case asBytes && (r < 0x20 || r >= 0x7f), !strconv.IsPrint(r):
			p.write(escape(r))
		default:
			p.write(s[i : i+size])
		}
		i += size
	}
}

// escape is Python's escape of a character: \xNN, \uNNNN or \UNNNNNNNN.
func escape(r rune) string {
	switch {
	case r < 0x100:
		return fmt.Sprintf(`\x%02x`, r)
	case r < 0x10000:
		return fmt.Sprintf(`\u%04x`, r)
	}
	return fmt.Sprintf(`\U%08x`, r)
}

// pyFloat is Python's repr of a float, near enough: a whole number keeps ".0".
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	case f == math.Trunc(f) && math.Abs(f) < 1e16:
		return strconv.FormatFloat(f, 'f', -1, 64) + ".0"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
