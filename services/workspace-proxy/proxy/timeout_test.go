package proxy

import (
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// A checkpoint or a restore moves the whole workspace and gets 5 minutes;
// every other operation is one request to the workspace server.
func TestOpTimeout(t *testing.T) {
	id := "aaaaaaaaaaaa"
	for op, want := range map[string]time.Duration{
		bus.WSCheckpoint: 5 * time.Minute,
		bus.WSRestore:    5 * time.Minute,
		"tree":           wsapi.Timeout + 5*time.Second,
		"read":           wsapi.Timeout + 5*time.Second,
	} {
		if got := opTimeout(bus.WSSubject(id, op)); got != want {
			t.Errorf("opTimeout(%s) = %v, want %v", bus.WSSubject(id, op), got, want)
		}
	}
}
