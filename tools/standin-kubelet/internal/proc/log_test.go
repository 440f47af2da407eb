package proc

import (
	"bytes"
	"testing"
)

func TestLogRingKeepsTheLastBytes(t *testing.T) {
	var l logRing
	l.write([]byte("head\n"))
	big := bytes.Repeat([]byte("x"), LogBytes)
	l.write(big)
	l.write([]byte("tail\n"))
	got := l.bytes()
	if len(got) != LogBytes || !bytes.HasSuffix(got, []byte("xtail\n")) || bytes.Contains(got, []byte("head")) {
		t.Fatalf("ring holds %d bytes ending %q", len(got), got[len(got)-8:])
	}
}
