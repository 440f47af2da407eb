// Package parallel runs indexed work on a bounded number of goroutines.
// It has no dependencies, so the workspace-server binary can use it too.
package parallel

import (
	"context"
	"sync"
	"sync/atomic"
)

// Do calls fn for every i in [0, n) on at most workers goroutines, waits
// for all of them, and returns the first error (or ctx's). After a
// failure no new calls start.
func Do(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, max(workers, 1)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
