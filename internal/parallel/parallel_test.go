package parallel

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// TestEachLimit: every item is called once, and no more than limit at a time; the first limit
// items are all running at once before any of them returns.
func TestEachLimit(t *testing.T) {
	const limit = 3
	items := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	var mu sync.Mutex
	var called []int
	active, most := 0, 0
	started := make(chan struct{}, len(items))
	release := make(chan struct{})
	go func() {
		for range limit {
			<-started
		}
		close(release) // the first limit items run together: only then does any return
	}()
	Each(context.Background(), limit, items, func(i int) {
		mu.Lock()
		active++
		most = max(most, active)
		called = append(called, i)
		mu.Unlock()
		started <- struct{}{}
		<-release
		mu.Lock()
		active--
		mu.Unlock()
	})
	slices.Sort(called)
	if !slices.Equal(called, items) || most != limit {
		t.Errorf("called %v, at most %d at a time; want every item once, %d at a time", called, most, limit)
	}
}

// TestEachStopsStarting: once ctx ends no item starts; one already running finishes.
func TestEachStopsStarting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var called []int
	Each(ctx, 1, []int{0, 1, 2}, func(i int) {
		called = append(called, i)
		cancel()
	})
	if !slices.Equal(called, []int{0}) {
		t.Errorf("called %v after the context ended in the first; want [0]", called)
	}
	called = nil
	Each(ctx, 0, []int{0, 1}, func(i int) { called = append(called, i) })
	if len(called) != 0 {
		t.Errorf("called %v with an ended context", called)
	}
}
