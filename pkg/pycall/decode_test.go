package pycall_test

import (
	"bytes"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/pycall"
)

// The bound on what decoding a reply allocates (the package doc's): allocPerByte bytes per
// byte of the pickle, and allocBase. The worst input measured (a pickle of nothing but
// EMPTY_SET, each an Object of its own) allocates 264 bytes per byte; a pickle of ordinary
// data 10 to 40.
const (
	allocPerByte = 320
	allocBase    = 64 << 10
)

// fewMiB is what an attack may make DecodeEnvelope allocate before it gives its error.
const fewMiB = 4 << 20

// allocated returns the bytes f allocated, freed or not. Tests that call it run one at a time.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".pickle"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// failedWith is an ok=False envelope whose exc_type is the pickle fragment excType (which
// may use memo entries from 0 on: the envelope memoizes nothing before it):
//
//	PROTO 5, EMPTY_DICT, MARK, 'ok', NEWFALSE, 'exc_type', excType..., 'message', '',
//	'traceback', '', SETITEMS, STOP
func failedWith(excType []byte) []byte {
	b := []byte("\x80\x05}(\x8c\x02ok\x89\x8c\x08exc_type")
	b = append(b, excType...)
	return append(b, "\x8c\x07message\x8c\x00\x8c\x09traceback\x8c\x00u."...)
}

// dagTuples is a pickle fragment of a tuple that holds the one below it twice, levels deep,
// as CPython writes it: EMPTY_TUPLE, MEMOIZE, then each level BINGET of the tuple below (the
// first reference is the one left on the stack), TUPLE2, MEMOIZE. 4 bytes double it.
func dagTuples(levels int) []byte {
	b := []byte(")\x94")
	for i := range levels {
		b = append(b, 'h', byte(i), 0x86, 0x94)
	}
	return b
}

// TestAttacks: the replies a restored process can send to make its caller crash or spend
// without bound (issue 35) each give their error, naming the limit, in a short error and a
// few MiB. Before the bounded decoder: the cyclic dict crashed the caller (fatal error: stack
// overflow, no deferred function run); the tuple DAG 20 levels deep (a 127-byte reply) made a
// 5 MiB error string, each 4 bytes more doubling it; the memo flood of 4 MiB allocated 672
// MiB and took a minute.
func TestAttacks(t *testing.T) {
	deep := append(bytes.Repeat([]byte("]"), pycall.MaxDepth+1), bytes.Repeat([]byte("a"), pycall.MaxDepth)...)
	for _, tc := range []struct {
		name  string
		reply []byte
		want  error
	}{
		{"cyclic dict (CPython)", fixture(t, "attack-cyclic-dict"), pycall.ErrCycle},
		{"tuple DAG 60 levels deep (CPython)", fixture(t, "attack-dag60-tuples"), pycall.ErrTooLarge},
		{"list DAG 60 levels deep (CPython)", fixture(t, "attack-dag60-lists"), pycall.ErrTooLarge},
		{"tuple DAG 200 levels deep", failedWith(dagTuples(200)), pycall.ErrTooLarge},
		// EMPTY_LIST, then MEMOIZE 4 Mi times: one object named by ever more memo entries.
		{"memo flood of 4 MiB", failedWith(append([]byte("]"), bytes.Repeat([]byte{0x94}, 4<<20)...)), pycall.ErrMemo},
		// EMPTY_LIST, LONG_BINPUT 2^32-1: a memo entry far past the next.
		{"memo index far ahead", failedWith([]byte("]r\xff\xff\xff\xff")), pycall.ErrMemo},
		// EMPTY_LIST MaxDepth+1 times, then APPEND each into the one below.
		{"lists nested past MaxDepth", failedWith(deep), pycall.ErrDepth},
		// A list appended to itself: EMPTY_LIST, MEMOIZE, BINGET 0, APPEND.
		{"list inside itself", failedWith([]byte("]\x94h\x00a")), pycall.ErrCycle},
	} {
		var err error
		n := allocated(func() { _, err = pycall.DecodeEnvelope(tc.reply) })
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: DecodeEnvelope = %v, want %v", tc.name, err, tc.want)
			continue
		}
		if len(err.Error()) > 1<<10 || n > fewMiB {
			t.Errorf("%s: an error of %d bytes after %d bytes allocated, want at most 1 KiB and %d", tc.name, len(err.Error()), n, fewMiB)
		}
		t.Logf("%s (%d bytes): %d KiB allocated: %v", tc.name, len(tc.reply), n>>10, err)
	}
}

// TestDecodeAsOgrek: the replies og-rek read right, real envelopes of the executor's kind
// (CPython, cloudpickle) and envelopes og-rek itself encodes as the tests do, decode to the
// same Go values as with og-rek.
func TestDecodeAsOgrek(t *testing.T) {
	encode := func(v any) []byte {
		var buf bytes.Buffer
		if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4}).Encode(v); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	cases := map[string][]byte{
		"envelope-smoke":  fixture(t, "envelope-smoke"),
		"envelope-values": fixture(t, "envelope-values"),
		"envelope-error":  fixture(t, "envelope-error"),
		"og-rek envelope": encode(map[string]any{"ok": true, "output": []any{"out\n"}, "value": []any{
			int64(1), int64(300), int64(70000), int64(-5), 1.5, "s", ogorek.Bytes("b"), true, false, nil,
			ogorek.Tuple{}, ogorek.Tuple{int64(1)}, ogorek.Tuple{int64(1), int64(2), int64(3), int64(4)},
			map[string]any{"k": []any{}}, ogorek.Class{Module: "builtins", Name: "eval"},
		}}),
	}
	for name, b := range cases {
		want, err := ogorek.NewDecoderWithConfig(bytes.NewReader(b), &ogorek.DecoderConfig{StrictUnicode: true}).Decode()
		if err != nil {
			t.Fatalf("%s: og-rek: %v", name, err)
		}
		got, err := pycall.Decode(b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Decode = %s, %v\nog-rek: %s", name, pycall.Format(got, 4<<10), err, pycall.Format(want, 4<<10))
		}
	}
}

// TestDecodeObjects: what og-rek got wrong or refused. A list referred to twice is the same
// list, filled, both times (og-rek gave [[1, 2], []]); sets, a global called (REDUCE) and an
// OrderedDict (REDUCE, then SETITEM into it) are Objects.
func TestDecodeObjects(t *testing.T) {
	v, err := pycall.DecodeEnvelope(fixture(t, "envelope-objects"))
	if err != nil {
		t.Fatal(err)
	}
	class := func(module, name string) ogorek.Class { return ogorek.Class{Module: module, Name: name} }
	want := map[any]any{
		"shared":    []any{[]any{int64(1), int64(2)}, []any{int64(1), int64(2)}},
		"set":       pycall.Object{Callable: class("builtins", "set"), Args: ogorek.Tuple{[]any{int64(3)}}},
		"frozenset": pycall.Object{Callable: class("builtins", "frozenset"), Args: ogorek.Tuple{[]any{"f"}}},
		"date":      pycall.Object{Callable: class("datetime", "date"), Args: ogorek.Tuple{ogorek.Bytes("\x07\xe8\x01\x02")}},
		"ordered":   pycall.Object{Callable: class("collections", "OrderedDict"), Args: ogorek.Tuple{}, DictItems: map[any]any{"a": int64(1)}},
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("Decode = %s\nwant     %s", pycall.Format(v, 4<<10), pycall.Format(want, 4<<10))
	}
	shared := v.(map[any]any)["shared"].([]any)
	if &shared[0].([]any)[0] != &shared[1].([]any)[0] {
		t.Errorf("the list referred to twice decoded as two lists")
	}
}

// TestDecodeByValue: objects of classes pickled by value (cloudpickle's calls of its own
// functions; a class whose method refers to it through super(), a cycle the pickle builds and
// pops, never returns) decode to Objects that say how they would be built.
func TestDecodeByValue(t *testing.T) {
	v, err := pycall.DecodeEnvelope(fixture(t, "envelope-byvalue"))
	d, _ := v.(map[any]any)
	if err != nil || d == nil {
		t.Fatalf("DecodeEnvelope = %s, %v", pycall.Format(v, 1<<10), err)
	}
	if got, want := pycall.Format(d["defaultdict"], 1<<10), "collections.defaultdict(builtins.list) + {'a': [1]}"; got != want {
		t.Errorf("defaultdict = %s, want %s", got, want)
	}
	instance, _ := d["instance"].(pycall.Object)
	class, _ := instance.Callable.(pycall.Object)
	if !reflect.DeepEqual(instance.State, map[any]any{"x": int64(2)}) || len(instance.Args) != 0 ||
		class.Callable != (ogorek.Class{Module: "cloudpickle.cloudpickle", Name: "_make_skeleton_class"}) || len(class.Args) < 2 || class.Args[1] != "Child" {
		t.Errorf("instance = %s, want a Child built by cloudpickle's _make_skeleton_class with state {'x': 2}", pycall.Format(d["instance"], 1<<10))
	}
}

// TestDecodeValues: scalars at the edges of their opcodes.
func TestDecodeValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pickle string // after PROTO 5, before STOP
		want   any
	}{
		{"BININT negative", "J\xff\xff\xff\xff", int64(-1)},
		{"BININT2", "M\xff\xff", int64(65535)},
		{"LONG1 empty", "\x8a\x00", big.NewInt(0)},
		{"LONG1 -256", "\x8a\x02\x00\xff", big.NewInt(-256)},
		{"LONG4 2^32", "\x8b\x05\x00\x00\x00\x00\x00\x00\x00\x01", big.NewInt(1 << 32)},
		{"BINUNICODE8", "\x8d\x02\x00\x00\x00\x00\x00\x00\x00h\xc3", "h\xc3"},
		{"BINBYTES8", "\x8e\x01\x00\x00\x00\x00\x00\x00\x00\x00", ogorek.Bytes("\x00")},
		{"GLOBAL", "cmod.sub\nname\n", ogorek.Class{Module: "mod.sub", Name: "name"}},
		{"NEWOBJ_EX and BUILD", "cm\nC\n)}\x8c\x01kK\x01s\x92}b", pycall.Object{Callable: ogorek.Class{Module: "m", Name: "C"}, Args: ogorek.Tuple{}, Kwargs: map[any]any{"k": int64(1)}, State: map[any]any{}}},
		{"NEWOBJ and APPENDS", "cm\nL\n)\x81(K\x01e", pycall.Object{Callable: ogorek.Class{Module: "m", Name: "L"}, Args: ogorek.Tuple{}, ListItems: []any{int64(1)}}},
		{"POP at a mark pops the mark", "N(0", ogorek.None{}},
		{"POP_MARK", "N(K\x01K\x021", ogorek.None{}},
		{"FRAME", "\x95\x01\x00\x00\x00\x00\x00\x00\x00N", ogorek.None{}},
		{"DICT", "(\x8c\x01kNd", map[any]any{"k": ogorek.None{}}},
	} {
		got, err := pycall.Decode([]byte("\x80\x05" + tc.pickle + "."))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Decode = %s, %v; want %s", tc.name, pycall.Format(got, 1<<10), err, pycall.Format(tc.want, 1<<10))
		}
	}
}

// TestDecodeRefuses: broken pickles and what a reply does not need, each with its error.
func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, pickle string
		want         error
	}{
		{"empty", "", pycall.ErrMalformed},
		{"no PROTO", "N.", pycall.ErrMalformed},
		{"protocol 1", "\x80\x01N.", pycall.ErrMalformed},
		{"protocol 6", "\x80\x06N.", pycall.ErrMalformed},
		{"no STOP", "\x80\x05N", pycall.ErrMalformed},
		{"a byte after STOP", "\x80\x05N.N", pycall.ErrMalformed},
		{"two values at STOP", "\x80\x05NN.", pycall.ErrMalformed},
		{"a mark at STOP", "\x80\x05(N.", pycall.ErrMalformed},
		{"nothing at STOP", "\x80\x05.", pycall.ErrMalformed},
		{"a string longer than the pickle", "\x80\x05X\xff\xff\xff\x7fab.", pycall.ErrMalformed},
		{"BINBYTES8 of 2^64-1", "\x80\x05\x8e\xff\xff\xff\xff\xff\xff\xff\xff.", pycall.ErrMalformed},
		{"a frame past the end", "\x80\x05\x95\xff\x00\x00\x00\x00\x00\x00\x00N.", pycall.ErrMalformed},
		{"LONG4 of a negative length", "\x80\x05\x8b\xff\xff\xff\xff.", pycall.ErrMalformed},
		{"GLOBAL without a newline", "\x80\x05cmod", pycall.ErrMalformed},
		{"a memo entry never put", "\x80\x05h\x00.", pycall.ErrMalformed},
		{"MEMOIZE of nothing", "\x80\x05\x94N.", pycall.ErrMalformed},
		{"TUPLE2 across a mark", "\x80\x05N(N\x86.", pycall.ErrMalformed},
		{"APPENDS without a mark", "\x80\x05]Ne.", pycall.ErrMalformed},
		{"APPEND with nothing", "\x80\x05]a.", pycall.ErrMalformed},
		{"a dict of an odd count", "\x80\x05(Nd.", pycall.ErrMalformed},
		{"STACK_GLOBAL of ints", "\x80\x05K\x01K\x02\x93.", pycall.ErrMalformed},
		{"REDUCE of a list", "\x80\x05cm\nf\n]R.", pycall.ErrMalformed},
		{"APPEND into a dict", "\x80\x05}Na.", pycall.ErrUnsupported},
		{"SETITEM into a list", "\x80\x05]NNs.", pycall.ErrUnsupported},
		{"a tuple as a dict key", "\x80\x05})Ns.", pycall.ErrUnsupported},
		{"BUILD on a list", "\x80\x05]Nb.", pycall.ErrUnsupported},
		{"BUILD twice", "\x80\x05cm\nC\n)RNbNb.", pycall.ErrUnsupported},
		{"protocol 0 INT", "\x80\x05I1\n.", pycall.ErrUnsupported},
		{"DUP", "\x80\x05N2.", pycall.ErrUnsupported},
		{"persistent id", "\x80\x05NQ.", pycall.ErrUnsupported},
		{"out-of-band buffer", "\x80\x05\x97.", pycall.ErrUnsupported},
	} {
		v, err := pycall.Decode([]byte(tc.pickle))
		if !errors.Is(err, tc.want) || v != nil {
			t.Errorf("%s: Decode = %v, %v; want %v", tc.name, pycall.Format(v, 100), err, tc.want)
		}
	}
}

// TestDecodeAllocBound: the inputs that allocate the most per byte, 256 KiB of each,
// stay under the bound FuzzDecodeEnvelope checks on every input.
func TestDecodeAllocBound(t *testing.T) {
	flood := func(head, unit, tail string) []byte {
		b := []byte("\x80\x05" + head)
		b = append(b, bytes.Repeat([]byte(unit), (256<<10)/len(unit))...)
		return append(b, tail+"."...)
	}
	for name, pickle := range map[string][]byte{
		"EMPTY_SET":              flood("(", "\x8f", "l"),
		"EMPTY_DICT":             flood("(", "}", "l"),
		"EMPTY_LIST":             flood("(", "]", "l"),
		"EMPTY_TUPLE":            flood("(", ")", "l"),
		"EMPTY_LIST MEMOIZE":     flood("(", "]\x94", "l"),
		"NONE":                   flood("(", "N", "l"),
		"MARK":                   flood("", "(", "N"),
		"TUPLE1":                 flood("N", "\x85", ""),
		"BINGET":                 flood("]\x94(", "h\x00", "l"),
		"REDUCE":                 flood("(", "cm\nf\n)R", "l"),
		"SETITEM":                flood("}", "J\x01\x02\x03\x04Ns", ""),
		"SHORT_BINUNICODE":       flood("(", "\x8c\x01a", "l"),
		"a tuple DAG of 256 KiB": failedWith(dagTuples(1 << 16)),
		"the smoke reply itself": fixture(t, "envelope-smoke"),
	} {
		var err error
		n := allocated(func() { _, err = pycall.DecodeEnvelope(pickle) })
		if bound := allocPerByte*uint64(len(pickle)) + allocBase; n > bound {
			t.Errorf("%s: %d bytes allocated for %d, over the bound of %d (%v)", name, n, len(pickle), bound, err)
		}
		t.Logf("%s: %.1f bytes allocated per byte (%v)", name, float64(n)/float64(len(pickle)), err)
	}
}

// TestDecodeEnvelopeError: an ok=False envelope's error shows its parts, each cut to its
// bound: a 16 MiB message makes an error of a few KiB, its text kept as text.
func TestDecodeEnvelopeError(t *testing.T) {
	_, err := pycall.DecodeEnvelope(fixture(t, "envelope-error"))
	want := "executor answered ok=False: ZeroDivisionError: division by zero\nTraceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nZeroDivisionError: division by zero\n"
	if err == nil || err.Error() != want {
		t.Fatalf("DecodeEnvelope = %q, want %q", err, want)
	}
	huge := strings.Repeat("m", 16<<20)
	reply := []byte("\x80\x05}(\x8c\x02ok\x89\x8c\x08exc_type\x8c\x01E\x8c\x07message\x8d\x00\x00\x00\x01\x00\x00\x00\x00" + huge + "\x8c\x09traceback\x8c\x05a\x1b[2Ju.")
	_, err = pycall.DecodeEnvelope(reply)
	if err == nil || len(err.Error()) > 21<<10 || !strings.HasPrefix(err.Error(), "executor answered ok=False: E: mmm") || !strings.HasSuffix(err.Error(), `...`+"\n"+`a\x1b[2J`) {
		t.Fatalf("DecodeEnvelope of a 16 MiB message: an error of %d bytes: %.100q...%q", len(err.Error()), err, err.Error()[max(0, len(err.Error())-40):])
	}
}
