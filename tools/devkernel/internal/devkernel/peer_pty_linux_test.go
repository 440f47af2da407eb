package devkernel

import (
	"os/exec"
	"strings"
	"testing"
)

// Over a terminal the gate byte arrives with no newline and is read at
// once (the workload leaves canonical mode), echoed once (the terminal's
// own echo is off), and the output arrives as written (no \r added).
func TestPeerGateOverPTY(t *testing.T) {
	ptmx, tty := openPTY(t)
	out := &syncBuffer{}
	readDone := make(chan struct{})
	go func() { // owned: waited for below
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			_, _ = out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		ptmx.Close()
		<-readDone
	}()
	cmd := exec.Command(kernelBin, writeManifest(t, manifest("gate", "")))
	cmd.Env = testEnv("PEER_OUTPUT_BYTES=64", "PEER_CHUNK=64", "PEER_GATE=stdin", "NO_COLOR=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	// The ready line (stderr, the same terminal) follows the banner.
	waitUntil(t, waitLong, func() bool { return strings.Contains(out.String(), "devkernel gate ready") }, "ready line; got %q", lazyString{out})
	if _, err := ptmx.Write([]byte("g")); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("devkernel = %v, output %q", err, out)
	}
	waitUntil(t, waitLong, func() bool { return strings.Contains(out.String(), "g0123456789") }, "the echoed gate byte then the output; got %q", lazyString{out})
	if n := strings.Count(out.String(), "g0123456789"); n != 1 || strings.Count(out.String(), "gg") != 0 {
		t.Errorf("output %q: want the gate byte echoed once", out)
	}
	_, after, _ := strings.Cut(out.String(), "g0123456789")
	if want := string(patternLine[10:]); after != want {
		t.Errorf("output after the gate = %q, want %q (the 64 bytes as written)", after, want)
	}
}
