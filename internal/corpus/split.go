package corpus

// heldOutModulus: one request in five is held out from planning.
const heldOutModulus = 5

// HeldOut reports whether the request at index i (its position among the corpus's requests,
// from 0, blank lines and format aside) belongs to the held-out part. It is a hash of the index
// alone (splitmix64, mod 5 == 0): the same file always splits the same way, on any machine, and
// appending requests never moves the earlier ones. Identical requests at different indexes fall
// on either side, as repeated requests do in a real stream.
func HeldOut(i int) bool { return splitmix64(uint64(i))%heldOutModulus == 0 }

// Split returns the requests to plan from and the held-out ones, each in file order.
func (c *Corpus) Split() (planned, heldOut []Request) {
	for i, r := range c.Requests {
		if HeldOut(i) {
			heldOut = append(heldOut, r)
		} else {
			planned = append(planned, r)
		}
	}
	return planned, heldOut
}

// splitmix64 returns x through the finalizer of Steele, Lea and Flood's SplitMix64: a fixed
// bijection of 64-bit integers whose outputs are well mixed even for consecutive inputs.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
