package pycall_test

import (
	"math/big"
	"os"
	"path/filepath"
	"testing"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/pycall"
)

// errorBound is the longest error DecodeEnvelope gives: the ok=False error's three parts at
// their bounds (256 bytes, 4 KiB, 16 KiB) and its words, or a decoding error.
const errorBound = 21 << 10

// FuzzDecodeEnvelope checks, for any reply, that DecodeEnvelope gives a value or a short
// error within the allocation bound (allocPerByte bytes a byte of the reply, and allocBase),
// and that what Decode returns keeps its promise: walked naively as a tree (walk), it ends
// within its expanded size's bound and MaxDepth, so it holds no cycle.
func FuzzDecodeEnvelope(f *testing.F) {
	pickles, err := filepath.Glob(filepath.Join("testdata", "*.pickle"))
	if err != nil || len(pickles) == 0 {
		f.Fatalf("no seeds in testdata: %v", err)
	}
	for _, name := range pickles {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(failedWith(dagTuples(10)))
	f.Add(failedWith([]byte("]\x94h\x00a")))
	f.Add(failedWith([]byte("cm\nC\n)\x81(K\x01e}b")))
	f.Fuzz(func(t *testing.T, reply []byte) {
		var v any
		var err error
		var text string
		n := allocated(func() {
			v, err = pycall.DecodeEnvelope(reply)
			if err == nil {
				text = pycall.Format(v, pycall.ErrorBytes)
			}
		})
		if bound := allocPerByte*uint64(len(reply)) + allocBase; n > bound {
			t.Fatalf("%d bytes allocated for a reply of %d, over the bound of %d (%v)", n, len(reply), bound, err)
		}
		if err != nil && len(err.Error()) > errorBound {
			t.Fatalf("an error of %d bytes", len(err.Error()))
		}
		if len(text) > pycall.ErrorBytes {
			t.Fatalf("Format(%d) gave %d bytes", pycall.ErrorBytes, len(text))
		}

		whole, err := pycall.Decode(reply)
		if err != nil {
			return
		}
		limit := pycall.ExpansionPerByte*int64(len(reply)) + pycall.ExpansionBase
		w := walker{left: limit}
		if !w.walk(whole, 0) {
			t.Fatalf("Decode returned a value deeper than %d or larger than %d as a tree", pycall.MaxDepth, limit)
		}
	})
}

// walker walks a decoded value as any code unaware of sharing would, counting as Decode's
// bound does, and gives up past the bound or MaxDepth (a cycle passes both).
type walker struct{ left int64 }

func (w *walker) walk(v any, depth int) bool {
	size := int64(1)
	switch v := v.(type) {
	case string:
		size += int64(len(v))
	case ogorek.Bytes:
		size += int64(len(v))
	case []byte:
		size += int64(len(v))
	case *big.Int:
		size += int64(len(v.Bits())) * 8
	case ogorek.Class:
		size += int64(len(v.Module) + len(v.Name))
	}
	if w.left -= size; w.left < 0 {
		return false
	}
	var children []any
	switch v := v.(type) {
	case []any:
		children = v
	case ogorek.Tuple:
		children = v
	case map[any]any:
		for k, val := range v {
			children = append(children, k, val)
		}
	case pycall.Object:
		children = []any{v.Callable, ogorek.Tuple(v.Args)}
		for _, c := range []any{v.State, v.ListItems, v.DictItems, v.Kwargs} {
			if c != nil && !isNilContainer(c) {
				children = append(children, c)
			}
		}
	default:
		return true
	}
	if depth >= pycall.MaxDepth {
		return false
	}
	for _, c := range children {
		if !w.walk(c, depth+1) {
			return false
		}
	}
	return true
}

func isNilContainer(v any) bool {
	switch v := v.(type) {
	case []any:
		return v == nil
	case map[any]any:
		return v == nil
	}
	return false
}
