package bus_test

import (
	"testing"

	"github.com/telorunner/telorunner/pkg/bus"
)

func TestWSOp(t *testing.T) {
	for subject, want := range map[string]string{
		bus.WSSubject("aaaaaaaaaaaa", bus.WSCheckpoint): bus.WSCheckpoint,
		bus.WSSubject("aaaaaaaaaaaa", "read"):           "read",
		bus.CtlSubject("aaaaaaaaaaaa", bus.CtlSuspend):  "",
		"runner.ws.aaaaaaaaaaaa":                        "",
		"runner.ws.aaaaaaaaaaaa.read.extra":             "",
	} {
		if got := bus.WSOp(subject); got != want {
			t.Errorf("WSOp(%q) = %q, want %q", subject, got, want)
		}
	}
}
