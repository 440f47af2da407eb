package bus_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
)

func TestDeadline(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	h := nats.Header{}
	if bus.Expired(h, now) {
		t.Error("a request without a deadline expired")
	}
	bus.SetDeadline(h, now.Add(10*time.Second))
	if got := h.Get(bus.HeaderDeadline); got != "1700000010000" {
		t.Errorf("%s = %q, want 1700000010000", bus.HeaderDeadline, got)
	}
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {10 * time.Second, false}, {10*time.Second + time.Millisecond, true}} {
		if got := bus.Expired(h, now.Add(tc.at)); got != tc.want {
			t.Errorf("Expired at +%v = %v, want %v", tc.at, got, tc.want)
		}
	}
	h.Set(bus.HeaderDeadline, "soon")
	if bus.Expired(h, now.Add(time.Hour)) {
		t.Error("an unreadable deadline expired")
	}
}
