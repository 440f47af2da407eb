package parallel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestDoVisitsEveryIndexOnBoundedWorkers(t *testing.T) {
	const n, workers = 1000, 4
	var mu sync.Mutex
	seen := map[int]int{}
	var running, peak atomic.Int64
	err := Do(context.Background(), n, workers, func(_ context.Context, i int) error {
		r := running.Add(1)
		for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
		}
		mu.Lock()
		seen[i]++
		mu.Unlock()
		running.Add(-1)
		return nil
	})
	if err != nil {
		t.Fatalf("Do() = %v", err)
	}
	if len(seen) != n {
		t.Fatalf("visited %d indexes, want %d", len(seen), n)
	}
	for i, c := range seen {
		if c != 1 || i < 0 || i >= n {
			t.Fatalf("index %d visited %d times", i, c)
		}
	}
	if peak.Load() > workers {
		t.Errorf("peak concurrency %d, want at most %d", peak.Load(), workers)
	}
}

func TestDoStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int64
	err := Do(context.Background(), 1000, 1, func(_ context.Context, i int) error {
		calls.Add(1)
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() != 11 {
		t.Fatalf("Do() = %v after %d calls, want boom after 11", err, calls.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Do(ctx, 5, 2, func(context.Context, int) error { t.Error("called after cancel"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do(cancelled) = %v", err)
	}
	if err := Do(context.Background(), 0, 0, func(context.Context, int) error { return boom }); err != nil {
		t.Fatalf("Do(n=0) = %v", err)
	}
}
