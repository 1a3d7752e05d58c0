package pycall

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"

	ogorek "github.com/kisielk/og-rek"
)

// The limits of Decode. A value's expanded size counts it as a tree, as a walk over it that
// does not know about sharing sees it: one per list, tuple, dict, set, object and scalar, plus
// the bytes of each string, bytes and big integer, every time it is reached.
const (
	// MaxDepth is the deepest nesting of containers Decode returns: twice as deep as CPython
	// 3.11's pickler goes (its recursion limit stops it near 500 nested lists).
	MaxDepth = 1000
	// ExpansionPerByte and ExpansionBase bound a value's expanded size to ExpansionPerByte
	// times the pickle's length plus ExpansionBase. A pickle with no shared references
	// expands to less than its length; sharing (a string or a list referred to many times)
	// expands it, and 60 levels of doubling in 8 bytes each would expand it 2^60 times.
	ExpansionPerByte = 64
	ExpansionBase    = 1 << 20
)

var (
	// ErrMalformed means the bytes are no pickle of protocol 2 to 5, or a broken one.
	ErrMalformed = errors.New("pycall: malformed pickle")
	// ErrUnsupported means the pickle uses what Decode does not decode: an opcode outside the
	// subset a reply needs, or a dict key Go cannot hash.
	ErrUnsupported = errors.New("pycall: unsupported pickle")
	// ErrDepth means the value nests more than MaxDepth containers deep.
	ErrDepth = errors.New("pycall: value nested too deeply")
	// ErrMemo means the pickle's memo has more entries than it made objects, or an index
	// past its next entry: a pickler memoizes each object once, in order.
	ErrMemo = errors.New("pycall: memo flood")
	// ErrCycle means the value contains itself.
	ErrCycle = errors.New("pycall: value contains itself")
	// ErrTooLarge means the value's expanded size is over its bound (ExpansionPerByte).
	ErrTooLarge = errors.New("pycall: value expands too much")
)

// Object stands for a Python object that a pickle builds by calling something (REDUCE, NEWOBJ,
// NEWOBJ_EX, then BUILD): an instance pickled by reference or by value, or a set. Decode
// records the call and never makes it.
type Object struct {
	// Callable is what would be called, usually an ogorek.Class: the class, or the function
	// that rebuilds the object (builtins.set for a set, builtins.frozenset for a frozenset).
	Callable any
	// Args are its positional arguments; Kwargs its keyword arguments (NEWOBJ_EX), or nil.
	Args   ogorek.Tuple
	Kwargs map[any]any
	// State is what BUILD would give the object's __setstate__, or nil.
	State any
	// ListItems and DictItems are what APPENDS and SETITEMS would add to it (a subclass of
	// list or dict, collections.OrderedDict, ...), or nil.
	ListItems []any
	DictItems map[any]any
}

// Decode decodes a pickle of protocol 2 to 5 (what cloudpickle writes) within bounds on
// everything it holds, and returns its value in og-rek's types: None, bool, int64, *big.Int,
// float64, string, ogorek.Bytes, []byte (a bytearray), []any (a list), ogorek.Tuple,
// map[any]any (a dict), ogorek.Class (a global) and Object. It returns no value that contains
// itself, nests deeper than MaxDepth or expands past its bound; each refusal matches its
// error (ErrCycle, ErrDepth, ErrTooLarge, ErrMemo, ErrMalformed, ErrUnsupported).
func Decode(pickle []byte) (any, error) {
	d := decoder{in: pickle}
	v, err := d.run()
	if err != nil {
		return nil, fmt.Errorf("pickle byte %d: %w", d.at, err)
	}
	r := resolver{limit: ExpansionPerByte*int64(len(pickle)) + ExpansionBase, classes: map[kind]any{
		kindSet:       ogorek.Class{Module: "builtins", Name: "set"},
		kindFrozenset: ogorek.Class{Module: "builtins", Name: "frozenset"},
	}}
	out, _, err := r.resolve(v, 0)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Opcodes of protocols 2 to 5 (CPython's Lib/pickletools.py), those Decode reads.
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opBinfloat       = 'G'
	opBinint         = 'J'
	opBinint1        = 'K'
	opBinint2        = 'M'
	opNone           = 'N'
	opReduce         = 'R'
	opBinunicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opAppends        = 'e'
	opBinget         = 'h'
	opLongBinget     = 'j'
	opList           = 'l'
	opBinput         = 'q'
	opLongBinput     = 'r'
	opSetitem        = 's'
	opTuple          = 't'
	opSetitems       = 'u'
	opEmptyDict      = '}'
	opEmptyList      = ']'
	opEmptyTuple     = ')'
	opBinbytes       = 'B'
	opShortBinbytes  = 'C'
	opProto          = 0x80
	opNewobj         = 0x81
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewtrue        = 0x88
	opNewfalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opShortBinunicod = 0x8c
	opBinunicode8    = 0x8d
	opBinbytes8      = 0x8e
	opEmptySet       = 0x8f
	opAdditems       = 0x90
	opFrozenset      = 0x91
	opNewobjEx       = 0x92
	opStackGlobal    = 0x93
	opMemoize        = 0x94
	opFrame          = 0x95
	opBytearray8     = 0x96
)

// kind is what a node is.
type kind uint8

const (
	kindList kind = iota
	kindTuple
	kindDict
	kindSet
	kindFrozenset
	kindObject
)

func (k kind) String() string {
	return [...]string{"list", "tuple", "dict", "set", "frozenset", "object"}[k]
}

// node is a container or an object while the pickle is decoded. The stack and the memo refer
// to it by pointer, as Python's do, so a list memoized empty and filled later is the same
// list wherever it is referred to, and a reference costs a pointer, never a copy.
type node struct {
	kind kind
	// items are a list's, tuple's or set's elements; a dict's keys and values, alternating;
	// an object's callable, args, kwargs, state, list items and dict items (the last two
	// nodes), nil when absent.
	items []any
	// Set by the resolver.
	state  resolveState
	height int
	size   int64
	out    any
}

type resolveState uint8

const (
	unresolved resolveState = iota
	resolving
	resolved
)

// decoder runs a pickle's opcodes. Every opcode is at least one byte and pushes at most one
// value, node or mark, so the stack, the marks and the nodes grow with the input; the memo is
// bounded by the objects made (ErrMemo); strings are copies of input bytes whose length is
// checked against the input before anything is allocated.
type decoder struct {
	in  []byte
	pos int
	at  int // where the current opcode starts, for errors
	// stack holds decoded values and *node; marks are the stack lengths at each MARK, as
	// CPython's metastack: nothing pops below the topmost mark.
	stack   []any
	marks   []int
	memo    []any
	created int
}

func (d *decoder) run() (any, error) {
	if len(d.in) < 2 || d.in[0] != opProto || d.in[1] < 2 || d.in[1] > 5 {
		return nil, fmt.Errorf("%w: it does not start with PROTO 2 to 5", ErrMalformed)
	}
	d.pos = 2
	for d.pos < len(d.in) {
		d.at = d.pos
		op := d.in[d.pos]
		d.pos++
		if op == opStop {
			return d.stop()
		}
		if err := d.step(op); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: it ends without STOP", ErrMalformed)
}

// stop ends the pickle: one value left, no mark, no byte after.
func (d *decoder) stop() (any, error) {
	if len(d.marks) > 0 || len(d.stack) != 1 {
		return nil, fmt.Errorf("%w: STOP with %d values and %d marks on the stack, want 1 and 0", ErrMalformed, len(d.stack), len(d.marks))
	}
	if d.pos != len(d.in) {
		return nil, fmt.Errorf("%w: %d bytes after STOP", ErrMalformed, len(d.in)-d.pos)
	}
	return d.stack[0], nil
}

func (d *decoder) step(op byte) error {
	switch op {
	case opProto:
		v, err := d.uint(1)
		if err != nil {
			return err
		}
		if v < 2 || v > 5 {
			return fmt.Errorf("%w: protocol %d", ErrMalformed, v)
		}
		return nil
	case opFrame:
		// Decode holds the whole pickle: a frame only has to fit in it.
		n, err := d.uint(8)
		if err != nil {
			return err
		}
		if n > uint64(len(d.in)-d.pos) {
			return fmt.Errorf("%w: a frame of %d bytes, %d left", ErrMalformed, n, len(d.in)-d.pos)
		}
		return nil
	case opMark:
		d.marks = grow(d.marks, 1)
		d.marks = append(d.marks, len(d.stack))
		return nil
	case opPop:
		// Popping at a mark pops the mark (CPython's load_pop).
		if len(d.marks) > 0 && len(d.stack) == d.floor() {
			d.marks = d.marks[:len(d.marks)-1]
			return nil
		}
		_, err := d.pop()
		return err
	case opPopMark:
		_, err := d.popMark()
		return err

	case opNone:
		return d.pushNew(ogorek.None{})
	case opNewtrue:
		return d.pushNew(true)
	case opNewfalse:
		return d.pushNew(false)
	case opBinint1:
		v, err := d.uint(1)
		return d.pushNewOr(int64(v), err)
	case opBinint2:
		v, err := d.uint(2)
		return d.pushNewOr(int64(v), err)
	case opBinint:
		v, err := d.uint(4)
		return d.pushNewOr(int64(int32(uint32(v))), err)
	case opLong1:
		return d.long(1)
	case opLong4:
		return d.long(4)
	case opBinfloat:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		return d.pushNew(math.Float64frombits(binary.BigEndian.Uint64(b)))

	case opShortBinunicod:
		return d.counted(1, func(b []byte) any { return string(b) })
	case opBinunicode:
		return d.counted(4, func(b []byte) any { return string(b) })
	case opBinunicode8:
		return d.counted(8, func(b []byte) any { return string(b) })
	case opShortBinbytes:
		return d.counted(1, func(b []byte) any { return ogorek.Bytes(b) })
	case opBinbytes:
		return d.counted(4, func(b []byte) any { return ogorek.Bytes(b) })
	case opBinbytes8:
		return d.counted(8, func(b []byte) any { return ogorek.Bytes(b) })
	case opBytearray8:
		return d.counted(8, func(b []byte) any { return bytes.Clone(b) })

	case opEmptyList:
		return d.pushNew(&node{kind: kindList})
	case opEmptyDict:
		return d.pushNew(&node{kind: kindDict})
	case opEmptySet:
		return d.pushNew(&node{kind: kindSet})
	case opEmptyTuple:
		return d.pushNew(&node{kind: kindTuple})
	case opList, opTuple, opFrozenset, opDict:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		k := kindList
		switch op {
		case opTuple:
			k = kindTuple
		case opFrozenset:
			k = kindFrozenset
		case opDict:
			k = kindDict
		}
		if k == kindDict {
			if err := checkPairs(items); err != nil {
				return err
			}
		}
		return d.pushNew(&node{kind: k, items: clone(items)})
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		if len(d.stack)-d.floor() < n {
			return fmt.Errorf("%w: a tuple of %d with %d values above the mark", ErrMalformed, n, len(d.stack)-d.floor())
		}
		items := clone(d.stack[len(d.stack)-n:])
		d.stack = d.stack[:len(d.stack)-n]
		return d.pushNew(&node{kind: kindTuple, items: items})

	case opAppend, opSetitem:
		n := 1
		if op == opSetitem {
			n = 2
		}
		if len(d.stack)-d.floor() < n+1 {
			return fmt.Errorf("%w: %s needs %d values above the mark", ErrMalformed, opName(op), n+1)
		}
		items := d.stack[len(d.stack)-n:]
		d.stack = d.stack[:len(d.stack)-n]
		return d.add(op, items)
	case opAppends, opSetitems, opAdditems:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if len(d.stack)-d.floor() < 1 {
			return fmt.Errorf("%w: %s with nothing to add to", ErrMalformed, opName(op))
		}
		return d.add(op, items)

	case opMemoize:
		return d.put(uint64(len(d.memo)))
	case opBinput:
		i, err := d.uint(1)
		if err != nil {
			return err
		}
		return d.put(i)
	case opLongBinput:
		i, err := d.uint(4)
		if err != nil {
			return err
		}
		return d.put(i)
	case opBinget, opLongBinget:
		size := 1
		if op == opLongBinget {
			size = 4
		}
		i, err := d.uint(size)
		if err != nil {
			return err
		}
		if i >= uint64(len(d.memo)) {
			return fmt.Errorf("%w: memo entry %d of %d", ErrMalformed, i, len(d.memo))
		}
		d.push(d.memo[i])
		return nil

	case opGlobal:
		module, err := d.line()
		if err != nil {
			return err
		}
		name, err := d.line()
		if err != nil {
			return err
		}
		return d.pushNew(ogorek.Class{Module: module, Name: name})
	case opStackGlobal:
		vs, err := d.popN(2)
		if err != nil {
			return err
		}
		module, okM := vs[0].(string)
		name, okN := vs[1].(string)
		if !okM || !okN {
			return fmt.Errorf("%w: STACK_GLOBAL of %s and %s, not two strings", ErrMalformed, typeName(vs[0]), typeName(vs[1]))
		}
		return d.pushNew(ogorek.Class{Module: module, Name: name})
	case opReduce, opNewobj:
		vs, err := d.popN(2)
		if err != nil {
			return err
		}
		if !isKind(vs[1], kindTuple) {
			return fmt.Errorf("%w: %s with arguments that are a %s, not a tuple", ErrMalformed, opName(op), typeName(vs[1]))
		}
		return d.pushNew(&node{kind: kindObject, items: []any{vs[0], vs[1], nil, nil, nil, nil}})
	case opNewobjEx:
		vs, err := d.popN(3)
		if err != nil {
			return err
		}
		if !isKind(vs[1], kindTuple) || !isKind(vs[2], kindDict) {
			return fmt.Errorf("%w: NEWOBJ_EX with a %s and a %s, not a tuple and a dict", ErrMalformed, typeName(vs[1]), typeName(vs[2]))
		}
		return d.pushNew(&node{kind: kindObject, items: []any{vs[0], vs[1], vs[2], nil, nil, nil}})
	case opBuild:
		vs, err := d.popN(2)
		if err != nil {
			return err
		}
		obj, ok := vs[0].(*node)
		if !ok || obj.kind != kindObject || obj.items[3] != nil {
			return fmt.Errorf("%w: BUILD on a %s (only on an object REDUCE or NEWOBJ made, once)", ErrUnsupported, typeName(vs[0]))
		}
		obj.items[3] = vs[1]
		d.push(obj)
		return nil
	}
	return fmt.Errorf("%w: opcode %s", ErrUnsupported, opName(op))
}

// add is APPEND(S), SETITEM(S) and ADDITEMS: items into the container at the stack's top, or
// into an object's list or dict items.
func (d *decoder) add(op byte, items []any) error {
	target, _ := d.stack[len(d.stack)-1].(*node)
	want, slot := kindList, 4
	switch op {
	case opSetitem, opSetitems:
		want, slot = kindDict, 5
	case opAdditems:
		want = kindSet
	}
	if target != nil && target.kind == kindObject && want != kindSet {
		if target.items[slot] == nil {
			target.items[slot] = &node{kind: want}
		}
		target = target.items[slot].(*node)
	}
	if target == nil || target.kind != want {
		return fmt.Errorf("%w: %s into a %s, not a %s", ErrUnsupported, opName(op), typeName(d.stack[len(d.stack)-1]), want)
	}
	if want == kindDict {
		if err := checkPairs(items); err != nil {
			return err
		}
	}
	target.items = grow(target.items, len(items))
	target.items = append(target.items, items...)
	return nil
}

// checkPairs checks a dict's keys and values: an even count, and keys Go can hash.
func checkPairs(items []any) error {
	if len(items)%2 != 0 {
		return fmt.Errorf("%w: a dict of %d keys and values", ErrMalformed, len(items))
	}
	for i := 0; i < len(items); i += 2 {
		switch items[i].(type) {
		case ogorek.None, bool, int64, *big.Int, float64, string, ogorek.Bytes, ogorek.Class:
		default:
			return fmt.Errorf("%w: a dict key that is a %s", ErrUnsupported, typeName(items[i]))
		}
	}
	return nil
}

// put stores the stack's top in memo entry i: the next entry, or one that exists.
func (d *decoder) put(i uint64) error {
	if len(d.stack) == d.floor() {
		return fmt.Errorf("%w: memoize with nothing above the mark", ErrMalformed)
	}
	top := d.stack[len(d.stack)-1]
	switch {
	case i < uint64(len(d.memo)):
		d.memo[i] = top
	case i > uint64(len(d.memo)):
		return fmt.Errorf("%w: memo entry %d put before entry %d", ErrMemo, i, len(d.memo))
	case len(d.memo) >= d.created:
		return fmt.Errorf("%w: memo entry %d, for %d objects made", ErrMemo, i, d.created)
	default:
		d.memo = grow(d.memo, 1)
		d.memo = append(d.memo, top)
	}
	return nil
}

// long is LONG1 or LONG4: a two's complement little-endian integer of a counted length.
func (d *decoder) long(sizeBytes int) error {
	n, err := d.uint(sizeBytes)
	if err != nil {
		return err
	}
	if sizeBytes == 4 && int32(uint32(n)) < 0 {
		return fmt.Errorf("%w: LONG4 of a negative length", ErrMalformed)
	}
	b, err := d.take(n)
	if err != nil {
		return err
	}
	v := new(big.Int)
	if len(b) > 0 {
		be := make([]byte, len(b))
		for i, c := range b {
			be[len(b)-1-i] = c
		}
		v.SetBytes(be)
		if b[len(b)-1]&0x80 != 0 {
			v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
		}
	}
	return d.pushNew(v)
}

// counted reads a string of bytes after its sizeBytes-byte length and pushes wrap(it).
func (d *decoder) counted(sizeBytes int, wrap func([]byte) any) error {
	n, err := d.uint(sizeBytes)
	if err != nil {
		return err
	}
	b, err := d.take(n)
	if err != nil {
		return err
	}
	return d.pushNew(wrap(b))
}

// line reads up to the next newline (GLOBAL's arguments).
func (d *decoder) line() (string, error) {
	i := bytes.IndexByte(d.in[d.pos:], '\n')
	if i < 0 {
		return "", fmt.Errorf("%w: GLOBAL without a newline", ErrMalformed)
	}
	s := string(d.in[d.pos : d.pos+i])
	d.pos += i + 1
	return s, nil
}

// take returns the next n bytes, checked against what is left before anything is allocated.
func (d *decoder) take(n uint64) ([]byte, error) {
	if left := uint64(len(d.in) - d.pos); n > left {
		return nil, fmt.Errorf("%w: %d bytes wanted, %d left", ErrMalformed, n, left)
	}
	b := d.in[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

// uint reads a little-endian unsigned integer of size bytes (1, 2, 4 or 8).
func (d *decoder) uint(size int) (uint64, error) {
	b, err := d.take(uint64(size))
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := size - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// floor is how far the stack may be popped: the topmost mark.
func (d *decoder) floor() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

func (d *decoder) push(v any) {
	d.stack = grow(d.stack, 1)
	d.stack = append(d.stack, v)
}

// pushNew pushes an object the pickle made, which the memo may then name (put).
func (d *decoder) pushNew(v any) error {
	d.created++
	d.push(v)
	return nil
}

func (d *decoder) pushNewOr(v any, err error) error {
	if err != nil {
		return err
	}
	return d.pushNew(v)
}

func (d *decoder) pop() (any, error) {
	vs, err := d.popN(1)
	if err != nil {
		return nil, err
	}
	return vs[0], nil
}

// popN pops the top n values, above the topmost mark; the slice is valid until the next push.
func (d *decoder) popN(n int) ([]any, error) {
	if len(d.stack)-d.floor() < n {
		return nil, fmt.Errorf("%w: %d values wanted, %d above the mark", ErrMalformed, n, len(d.stack)-d.floor())
	}
	vs := d.stack[len(d.stack)-n:]
	d.stack = d.stack[:len(d.stack)-n]
	return vs, nil
}

// popMark pops the values above the topmost mark and the mark; the slice is valid until the
// next push.
func (d *decoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, fmt.Errorf("%w: no MARK", ErrMalformed)
	}
	k := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := d.stack[k:]
	d.stack = d.stack[:k]
	return items, nil
}

// grow makes room for n more elements by doubling: append grows a large slice by a quarter at
// a time, and so allocates up to five times what it ends up holding.
func grow[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	g := make([]T, len(s), max(2*cap(s), len(s)+n, 4))
	copy(g, s)
	return g
}

func clone(items []any) []any {
	if len(items) == 0 {
		return nil
	}
	return append(make([]any, 0, len(items)), items...)
}

func isKind(v any, k kind) bool {
	n, ok := v.(*node)
	return ok && n.kind == k
}

// typeName names a decoded value's Python type, for errors.
func typeName(v any) string {
	switch v := v.(type) {
	case *node:
		return v.kind.String()
	case ogorek.None:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case ogorek.Bytes:
		return "bytes"
	case []byte:
		return "bytearray"
	case ogorek.Class:
		return "global"
	}
	return fmt.Sprintf("%T", v)
}

// opName names an opcode as pickletools does, or by its value.
func opName(op byte) string {
	switch op {
	case opAppend:
		return "APPEND"
	case opAppends:
		return "APPENDS"
	case opSetitem:
		return "SETITEM"
	case opSetitems:
		return "SETITEMS"
	case opAdditems:
		return "ADDITEMS"
	case opReduce:
		return "REDUCE"
	case opNewobj:
		return "NEWOBJ"
	}
	if op >= 0x20 && op < 0x7f {
		return fmt.Sprintf("%#x (%q)", op, op)
	}
	return fmt.Sprintf("%#x", op)
}

// resolver turns the decoded nodes into Go values, refusing cycles, nesting over MaxDepth and
// expansion over limit. Each node is resolved once, and a node referred to again is the same
// Go value (a slice or a map shared, as the pickle's memo shares it), so its work and memory
// grow with the nodes and references, never with the expanded size. Its recursion is bounded
// by MaxDepth.
type resolver struct {
	limit int64
	// classes are builtins.set and builtins.frozenset, boxed once for every set.
	classes map[kind]any
}

func (r *resolver) resolve(v any, depth int) (out any, size int64, err error) {
	n, ok := v.(*node)
	if !ok {
		return v, leafSize(v), nil
	}
	switch n.state {
	case resolved:
		if depth+n.height > MaxDepth {
			return nil, 0, fmt.Errorf("%w: more than %d containers deep", ErrDepth, MaxDepth)
		}
		return n.out, n.size, nil
	case resolving:
		return nil, 0, fmt.Errorf("%w: a %s", ErrCycle, n.kind)
	}
	if depth >= MaxDepth {
		return nil, 0, fmt.Errorf("%w: more than %d containers deep", ErrDepth, MaxDepth)
	}
	n.state = resolving
	n.size, n.height = 1, 1
	if class, ok := r.classes[n.kind]; ok {
		// A set becomes an Object of a class and a tuple of a list: counted as such.
		n.size += leafSize(class) + 2
	}
	for i, item := range n.items {
		if item == nil { // an object's absent parts
			continue
		}
		o, s, err := r.resolve(item, depth+1)
		if err != nil {
			return nil, 0, err
		}
		n.items[i] = o
		n.size += s
		if n.size > r.limit {
			return nil, 0, fmt.Errorf("%w: over %d items and bytes as a tree (%d per byte of the pickle, and %d)", ErrTooLarge, r.limit, ExpansionPerByte, ExpansionBase)
		}
		if c, ok := item.(*node); ok {
			n.height = max(n.height, c.height+1)
		}
	}
	n.out = n.value(r.classes)
	n.state = resolved
	return n.out, n.size, nil
}

// value is a resolved node's Go value; its items are resolved.
func (n *node) value(classes map[kind]any) any {
	items := n.items[:len(n.items):len(n.items)]
	switch n.kind {
	case kindList:
		return nonNil(items)
	case kindTuple:
		return ogorek.Tuple(nonNil(items))
	case kindDict:
		m := make(map[any]any, len(items)/2)
		for i := 0; i < len(items); i += 2 {
			m[items[i]] = items[i+1]
		}
		return m
	case kindSet, kindFrozenset:
		return Object{Callable: classes[n.kind], Args: ogorek.Tuple{nonNil(items)}}
	}
	o := Object{Callable: items[0], Args: items[1].(ogorek.Tuple), State: items[3]}
	o.Kwargs, _ = items[2].(map[any]any)
	o.ListItems, _ = items[4].([]any)
	o.DictItems, _ = items[5].(map[any]any)
	return o
}

// nonNil is items, or an empty slice for none: og-rek's empty list and tuple.
func nonNil(items []any) []any {
	if items == nil {
		return []any{}
	}
	return items
}

// leafSize is a scalar's share of the expanded size: one, and its bytes.
func leafSize(v any) int64 {
	switch v := v.(type) {
	case string:
		return 1 + int64(len(v))
	case ogorek.Bytes:
		return 1 + int64(len(v))
	case []byte:
		return 1 + int64(len(v))
	case *big.Int:
		return 1 + int64(len(v.Bits()))*8
	case ogorek.Class:
		return 1 + int64(len(v.Module)+len(v.Name))
	}
	return 1
}
