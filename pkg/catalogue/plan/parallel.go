package plan

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// parallel runs fn(i) for every i in [0, n) on up to GOMAXPROCS goroutines. Each call must
// write only its own results; the caller combines them in index order, so a result never
// depends on how many goroutines ran or in what order they finished.
func parallel(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// chunk is how many groups one parallel task of a pass over the groups takes: large enough
// that scheduling costs nothing next to it, small enough to share the work of one pass.
const chunk = 512
