// Package parallel runs a function over items a bounded number at a time: the pipeline's
// sandboxes (captures and smoke tests, analysis probes) run side by side up to a configured
// number of jobs.
package parallel

import (
	"context"
	"sync"
)

// Each calls f on every item, at most limit at a time (one when limit < 1), starting them in
// order. Once ctx ends no further item starts; Each waits for those started. f records its own
// results and errors.
func Each[T any](ctx context.Context, limit int, items []T, f func(T)) {
	slots := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for _, item := range items {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			f(item)
		})
	}
	wg.Wait()
}
