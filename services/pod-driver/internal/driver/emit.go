package driver

import (
	"context"
	"slices"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// emitRun queues a run event of the projection. In a run session an
// outcome ends the session: under --inspect the kernel holds its process
// open after a one-shot's generation ends (10.2), so the session would
// never reach exited (19.29); the workload is stopped and the session ends
// exited with the generation's code (1 for a failed one, the CLI's code
// for a load or boot error). Called with the projection's lock held.
func (o *owned) emitRun(ev contract.Event) {
	o.enqueue(ev)
	if ev.Type != contract.EventRun || (ev.Phase != "completed" && ev.Phase != "failed") {
		return
	}
	code := 1
	if ev.Phase == "completed" && ev.Code != nil {
		code = *ev.Code
	}
	o.mu.Lock()
	if o.mode != contract.ModeRun || o.next != intentNone {
		o.mu.Unlock()
		return
	}
	o.next, o.finished = intentFinished, &code
	w := o.w
	o.mu.Unlock()
	if w == nil {
		return // still starting: the start stops it as soon as it runs
	}
	o.finishWG.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			o.log.Warn("stop a finished run workload", "err", err)
		}
	})
}

// enqueue queues an event for ordered emission; after the session ended
// it drops it.
func (o *owned) enqueue(ev contract.Event) { o.send(ev) }

// send queues ev and reports whether the queue was still open.
func (o *owned) send(ev contract.Event) bool {
	o.evMu.RLock()
	defer o.evMu.RUnlock()
	if o.evClosed {
		if ev.Type != "" {
			o.log.Debug("event after the session ended dropped", "type", ev.Type)
		}
		return false
	}
	o.events.push(ev)
	return true
}

// closeEvents ends the emission queue once every sender is out.
func (o *owned) closeEvents() {
	o.evMu.Lock()
	defer o.evMu.Unlock()
	if !o.evClosed {
		o.evClosed = true
		o.events.close()
	}
}

// emitLoop appends queued events in order. Everything queued while the
// previous append was in flight goes as one batch (one round trip however
// many events a burst queued), up to a flush marker.
func (o *owned) emitLoop() {
	defer close(o.evDone)
	var buf []contract.Event
	for {
		var ok bool
		buf, ok = o.events.popUpTo(buf[:0], bus.MaxBatch)
		if !ok {
			return
		}
		for evs := buf; len(evs) > 0; {
			n := slices.IndexFunc(evs, func(ev contract.Event) bool { return ev.Type == "" })
			if n < 0 {
				n = len(evs)
			}
			if n > 0 {
				if err := o.store.EmitBatch(context.Background(), o.id, evs[:n]); err != nil {
					o.log.Error("emit events", "events", n, "first", evs[0].Type, "err", err)
				}
			}
			if n < len(evs) { // flush marker: everything before it was appended
				o.flushMu.Unlock()
				n++
			}
			evs = evs[n:]
		}
	}
}

// flush waits until every queued event was appended.
func (o *owned) flush() {
	o.flushMu.Lock()
	if !o.send(contract.Event{}) {
		o.flushMu.Unlock() // closed: everything queued was appended
		return
	}
	o.flushMu.Lock() // unlocked by emitLoop at the marker
	o.flushMu.Unlock()
}
