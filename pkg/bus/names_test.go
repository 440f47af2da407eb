package bus_test

import (
	"testing"

	"github.com/telorunner/telorunner/pkg/bus"
)

func TestOp(t *testing.T) {
	for subject, want := range map[string]string{
		bus.WSSubject("aaaaaaaaaaaa", bus.WSCheckpoint): bus.WSCheckpoint,
		bus.WSSubject("aaaaaaaaaaaa", "read"):           "read",
		bus.CtlSubject("aaaaaaaaaaaa", bus.CtlSuspend):  bus.CtlSuspend,
		"runner.ws.aaaaaaaaaaaa":                        "",
		"runner.ws.aaaaaaaaaaaa.read.extra":             "",
		"runner.ctl..stop":                              "",
		"runner.evt.aaaaaaaaaaaa":                       "",
	} {
		if got := bus.Op(subject); got != want {
			t.Errorf("Op(%q) = %q, want %q", subject, got, want)
		}
	}
	if id, op, ok := bus.SessionOp(bus.CtlSubject("bbbbbbbbbbbb", bus.CtlApps)); !ok || id != "bbbbbbbbbbbb" || op != bus.CtlApps {
		t.Errorf("SessionOp = %q %q %v", id, op, ok)
	}
}
