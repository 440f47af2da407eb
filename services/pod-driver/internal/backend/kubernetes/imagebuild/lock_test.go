package imagebuild

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// Two drivers (two connections with the driver role) contend for one ref:
// exactly one holds it at a time, the other reports waiting once and gets
// it after the release.
func TestLocksSingleFlightAcrossDrivers(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	ctx := t.Context()
	var locks []*Locks
	for _, id := range []string{"driver-a", "driver-b"} {
		_, js := testkit.Connect(t, s, bus.RoleDriver)
		l, err := OpenLocks(ctx, js, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Poll = 200 * time.Millisecond
		locks = append(locks, l)
	}
	const ref = "registry.example/telo/apps:0123"
	var holders, maxHolders, waits atomic.Int32
	var wg sync.WaitGroup
	for _, l := range locks {
		wg.Go(func() {
			release, err := l.Acquire(ctx, ref, func() { waits.Add(1) })
			if err != nil {
				t.Error(err)
				return
			}
			n := holders.Add(1)
			for {
				m := maxHolders.Load()
				if n <= m || maxHolders.CompareAndSwap(m, n) {
					break
				}
			}
			// Hold until the other driver has either found the lock
			// taken (it waits) or taken it too (the check below fails).
			if !testkit.Poll(ctx, 30*time.Second, func() bool { return waits.Load() > 0 || holders.Load() > 1 }) {
				t.Error("the other driver neither waited nor held the lock within 30 s")
			}
			holders.Add(-1)
			release()
			release() // idempotent
		})
	}
	wg.Wait()
	if maxHolders.Load() != 1 {
		t.Fatalf("%d drivers held the lock at once", maxHolders.Load())
	}
	if waits.Load() != 1 {
		t.Fatalf("waiting reported %d times, want 1", waits.Load())
	}
	// Another ref is independent.
	r1, err := locks[0].Acquire(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r1()
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r2, err := locks[1].Acquire(ctx2, ref+"x", func() { t.Error("an unrelated ref waited") })
	if err != nil {
		t.Fatal(err)
	}
	r2()
}

// A holder that dies (never releases, never renews) loses the lock when
// the bucket's TTL expires; a live holder keeps it past the TTL by
// renewing.
func TestLocksExpireAndRenew(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	ctx := t.Context()
	_, js := testkit.Connect(t, s, bus.RoleDriver)
	l, err := OpenLocks(ctx, js, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Poll = 200 * time.Millisecond
	const ref = "r/x:1"
	// A dead holder: its key, written as Acquire writes it, never renewed.
	if _, err := l.KV.Create(ctx, bus.BuildKey(ref), []byte("dead")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	release, err := l.Acquire(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < bus.BuildLockTTL-2*time.Second {
		t.Fatalf("took a live key after %v (TTL %v)", d, bus.BuildLockTTL)
	}
	// Held past one TTL by renewal: the key is rewritten after the moment
	// its first write would have expired, and a second caller still waits.
	acquired := time.Now()
	testkit.Eventually(t, 2*bus.BuildLockTTL, func() bool {
		e, err := l.KV.Get(ctx, bus.BuildKey(ref))
		return err == nil && e.Created().After(acquired.Add(bus.BuildLockTTL))
	}, "the held lock was not renewed past its first TTL")
	ctx2, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx2, ref, nil); err == nil {
		t.Fatal("the renewed lock was taken by another caller")
	}
	release()
	r2, err := l.Acquire(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2()
}
