package proc

import "testing"

func TestFanoutCutsOffSlowSubscriber(t *testing.T) {
	f := newFanout()
	slow, fast := f.subscribe(), f.subscribe()
	for i := range subBuffer + 1 {
		f.publish([]byte{byte(i)})
		<-fast.ch
	}
	n := 0
	for range slow.ch {
		n++
	}
	if n != subBuffer || !f.isSlow(slow) {
		t.Errorf("slow subscriber got %d chunks (slow=%v), want %d and cut off", n, f.isSlow(slow), subBuffer)
	}
	if f.isSlow(fast) {
		t.Error("fast subscriber marked slow")
	}
	f.close()
	if _, ok := <-fast.ch; ok {
		t.Error("subscriber channel open after close")
	}
	if s := f.subscribe(); s != nil {
		t.Error("subscribe() after close returned a subscriber, want nil")
	}
	f.unsubscribe(fast) // no-op, must not panic
}
