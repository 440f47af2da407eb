package driver

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// TestEvQueueOrderBoundAndClose: events come out in order; a sender blocks
// while evQueueMax wait and goes on once one is taken; after close the
// waiting events still come out, then pop reports the end.
func TestEvQueueOrderBoundAndClose(t *testing.T) {
	q := newEvQueue()
	for i := range evQueueMax {
		q.push(contract.Event{Type: "progress", Message: strconv.Itoa(i)})
	}
	pushed := make(chan struct{})
	go func() {
		q.push(contract.Event{Type: "progress", Message: strconv.Itoa(evQueueMax)})
		close(pushed)
	}()
	select {
	case <-pushed:
		t.Fatalf("push into a full queue (%d waiting) returned without waiting", evQueueMax)
	case <-time.After(100 * time.Millisecond):
	}
	if ev, ok := q.pop(); !ok || ev.Message != "0" {
		t.Fatalf("first pop = %q, %v; want \"0\", true", ev.Message, ok)
	}
	select {
	case <-pushed:
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked push did not go on after a pop made room")
	}
	q.close()
	for i := 1; i <= evQueueMax; i++ {
		ev, ok := q.pop()
		if !ok || ev.Message != strconv.Itoa(i) {
			t.Fatalf("pop %d after close = %q, %v; want %q, true", i, ev.Message, ok, strconv.Itoa(i))
		}
	}
	if ev, ok := q.pop(); ok {
		t.Fatalf("pop of a closed, drained queue = %+v, true; want false", ev)
	}
}

// TestEvQueueCostsOnlyWhatWaits: an owned session's queue holding a few
// events costs kilobytes, not the ~1.1 MB a 4,096-slot channel of events
// did; a burst's backing array is given back once drained.
func TestEvQueueCostsOnlyWhatWaits(t *testing.T) {
	const n = 200
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	qs := make([]*evQueue, n)
	before := heap()
	for i := range qs {
		qs[i] = newEvQueue()
		qs[i].push(contract.Event{Type: "progress", Message: "Starting workload"})
	}
	per := (int64(heap()) - int64(before)) / n
	if per > 8<<10 {
		t.Fatalf("a queue holding one event costs %d bytes, want under 8 KiB", per)
	}
	t.Logf("a queue holding one event: %d bytes", per)
	runtime.KeepAlive(qs)

	q := newEvQueue()
	for range 1000 {
		q.push(contract.Event{Type: "progress"})
	}
	for range 1000 {
		q.pop()
	}
	if q.items != nil {
		t.Fatalf("a drained queue keeps a %d-slot array after a burst; want it released", cap(q.items))
	}
}
