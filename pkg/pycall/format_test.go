package pycall_test

import (
	"math"
	"math/big"
	"strings"
	"testing"
	"unicode/utf8"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/pycall"
)

func TestFormat(t *testing.T) {
	class := ogorek.Class{Module: "m", Name: "C"}
	huge := new(big.Int).Lsh(big.NewInt(1), 1<<15)
	for _, tc := range []struct {
		v    any
		want string
	}{
		{nil, "None"},
		{ogorek.None{}, "None"},
		{true, "True"},
		{int64(-3), "-3"},
		{big.NewInt(-1 << 40), "-1099511627776"},
		{huge, "<int of 32769 bits>"},
		{(*big.Int)(nil), "None"},
		{1.0, "1.0"},
		{1.5e300, "1.5e+300"},
		{math.Inf(-1), "-inf"},
		{"it's", `"it's"`},
		{`'"`, `'\'"'`},
		{"a\nb\\\x00\x1b\u2028é✓", `'a\nb\\\x00\x1b\u2028é✓'`},
		{"\xff", `'\xff'`},
		{ogorek.Bytes("a\x00\xffé"), `b'a\x00\xff\xc3\xa9'`},
		{[]byte("ba"), `bytearray(b'ba')`},
		{[]any{}, "[]"},
		{[]any{int64(1), "a"}, "[1, 'a']"},
		{ogorek.Tuple{}, "()"},
		{ogorek.Tuple{int64(1)}, "(1,)"},
		{ogorek.Tuple{int64(1), int64(2)}, "(1, 2)"},
		{map[any]any{}, "{}"},
		{map[any]any{"b": int64(2), "a": []any{}, int64(1): nil}, "{'a': [], 'b': 2, 1: None}"},
		{class, "m.C"},
		{ogorek.Class{Module: "m\n", Name: "\x1b"}, `m\x0a.\x1b`},
		{pycall.Object{Callable: class, Args: ogorek.Tuple{int64(1)}, Kwargs: map[any]any{"k": int64(2)}, State: "s", ListItems: []any{int64(3)}, DictItems: map[any]any{"d": int64(4)}},
			"m.C(1, **{'k': 2}).__setstate__('s') + [3] + {'d': 4}"},
		{pycall.Object{Callable: class, Args: ogorek.Tuple{}}, "m.C()"},
		{ogorek.Call{Callable: class, Args: ogorek.Tuple{int64(1)}}, "m.C(1)"},
		{7, "7"},
		{uint8(7), "7"},
		{float32(0.5), "0.5"},
		{"go", "'go'"},
		{make(chan int), "<chan int>"},
		{struct{ M map[string]any }{}, "<struct { M map[string]interface {} }>"},
	} {
		if got := pycall.Format(tc.v, 1<<10); got != tc.want {
			t.Errorf("Format(%T) = %s, want %s", tc.v, got, tc.want)
		}
	}
}

// TestFormatCyclesAndSharing: values built in Go that Decode never returns: a dict and a list
// inside themselves, and a list held twice.
func TestFormatCyclesAndSharing(t *testing.T) {
	m := map[any]any{}
	m["a"] = m
	l := make([]any, 2)
	l[0], l[1] = int64(1), l
	shared := []any{int64(1)}
	obj := pycall.Object{Callable: ogorek.Class{Module: "m", Name: "C"}, Args: ogorek.Tuple{shared}, State: shared}
	for _, tc := range []struct {
		v    any
		want string
	}{
		{m, "{'a': <cycle>}"},
		{l, "[1, <cycle>]"},
		{[]any{shared, shared, ogorek.Tuple{shared}}, "[[1], [...], ([...],)]"},
		{obj, "m.C([1]).__setstate__([...])"},
	} {
		if got := pycall.Format(tc.v, 1<<10); got != tc.want {
			t.Errorf("Format = %s, want %s", got, tc.want)
		}
	}
}

// TestFormatBounded: whatever the value, the text is at most the budget, cut on a character
// and ending in "..." when cut, and the work stops with it: 131 072 distinct lists, a 4 MiB
// string, a DAG 60 levels deep (each list shown once), a list nested 100 000 deep.
func TestFormatBounded(t *testing.T) {
	wide := make([]any, 1<<17)
	for i := range wide {
		wide[i] = []any{int64(i)}
	}
	var dag any = []any{}
	for range 60 {
		dag = []any{dag, dag}
	}
	var deep any = []any{}
	for range 100_000 {
		deep = []any{deep}
	}
	long := strings.Repeat("é", 2<<20)
	for _, tc := range []struct {
		name string
		v    any
		max  int
		cut  bool
	}{
		{"wide", wide, 4 << 10, true},
		{"string", long, 101, true},
		{"string in a list", []any{long}, 10, true},
		{"tiny budget", []any{int64(123456)}, 2, true},
		{"no budget", "abc", 0, true},
		{"DAG", dag, 4 << 10, false},
		{"deep", deep, 1 << 20, false},
	} {
		var got string
		n := allocated(func() { got = pycall.Format(tc.v, tc.max) })
		if len(got) > tc.max || !utf8.ValidString(got) || (tc.max >= 3 && tc.cut != strings.HasSuffix(got, "...")) || n > 64<<10+16*uint64(tc.max) {
			t.Errorf("%s: Format(%d) = %d bytes (%q...) after %d bytes allocated", tc.name, tc.max, len(got), got[:min(len(got), 40)], n)
		}
	}
	if got, want := pycall.Format(dag, 1<<10), strings.Repeat("[", 59)+"[[], []]"+strings.Repeat(", [...]]", 59); got != want {
		t.Errorf("Format(DAG) = %s, want %s", got, want)
	}
	if got, want := pycall.Format(deep, 1<<20), strings.Repeat("[", 100)+"[...]"+strings.Repeat("]", 100); got != want {
		t.Errorf("Format of a list nested 100 000 deep = %s, want 100 levels and [...]", got)
	}
}
