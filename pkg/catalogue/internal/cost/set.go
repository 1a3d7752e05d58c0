package cost

import "math/bits"

// Set is a set of modules of one Index, as a bitset over their positions. Sets of one Index all
// have the same length, so the operations below never need to grow them.
type Set []uint64

// Has reports whether position i is in the set.
func (s Set) Has(i int) bool { return s[i>>6]&(1<<(uint(i)&63)) != 0 }

// Add adds position i to the set.
func (s Set) Add(i int) { s[i>>6] |= 1 << (uint(i) & 63) }

// Remove removes position i from the set.
func (s Set) Remove(i int) { s[i>>6] &^= 1 << (uint(i) & 63) }

// Or adds every member of t to s.
func (s Set) Or(t Set) {
	for w := range s {
		s[w] |= t[w]
	}
}

// Clone returns a copy of s.
func (s Set) Clone() Set { return append(Set(nil), s...) }

// Len returns the number of members.
func (s Set) Len() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// Empty reports whether s has no member.
func (s Set) Empty() bool {
	for _, w := range s {
		if w != 0 {
			return false
		}
	}
	return true
}

// SubsetOf reports whether every member of s is in t.
func (s Set) SubsetOf(t Set) bool {
	for w := range s {
		if s[w]&^t[w] != 0 {
			return false
		}
	}
	return true
}

// Intersects reports whether s and t share a member.
func (s Set) Intersects(t Set) bool {
	for w := range s {
		if s[w]&t[w] != 0 {
			return true
		}
	}
	return false
}

// Equal reports whether s and t have the same members.
func (s Set) Equal(t Set) bool {
	for w := range s {
		if s[w] != t[w] {
			return false
		}
	}
	return true
}

// Members returns the positions in s in increasing order.
func (s Set) Members() []int {
	var out []int
	for w, word := range s {
		for word != 0 {
			out = append(out, w<<6+bits.TrailingZeros64(word))
			word &= word - 1
		}
	}
	return out
}

// Key returns a string with the set's bits, for use as a map key.
func (s Set) Key() string {
	b := make([]byte, 0, 8*len(s))
	for _, w := range s {
		for i := 0; i < 8; i++ {
			b = append(b, byte(w>>(8*i)))
		}
	}
	return string(b)
}

func trailingZeros(w uint64) int { return bits.TrailingZeros64(w) }
