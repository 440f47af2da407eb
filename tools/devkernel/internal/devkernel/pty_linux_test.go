package devkernel

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns a pseudo-terminal's controller and its terminal side.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	fd := int(ptmx.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	return ptmx, tty
}

// TestBannerOverPTY checks what the runner sees over a pty: tty=true and the
// banner coloured unless NO_COLOR, arriving while the process still runs.
func TestBannerOverPTY(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"colour", testEnv(), colourOn + "devkernel term generation 1 tty=true" + colourOff + "\r\n"},
		{"NO_COLOR", testEnv("NO_COLOR=1"), "devkernel term generation 1 tty=true\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ptmx, tty := openPTY(t)
			out := &syncBuffer{}
			readDone := make(chan struct{})
			go func() { // owned: waited for below
				defer close(readDone)
				buf := make([]byte, 4096)
				for {
					n, err := ptmx.Read(buf)
					_, _ = out.Write(buf[:n]) // a bytes.Buffer write cannot fail
					if err != nil {
						return // EIO once the terminal side is closed everywhere
					}
				}
			}()
			defer func() {
				ptmx.Close()
				<-readDone
			}()

			p := startKernelTo(t, tt.env, tty, writeManifest(t, manifest("term", "")))
			tty.Close() // the child holds its own copy
			waitUntil(t, waitLong, func() bool { return strings.Contains(out.String(), tt.want) },
				"banner %q over the pty; got %q, stderr %q", tt.want, lazyString{out}, lazyString{p.stderr})
			p.signal(t, unix.SIGTERM)
			if code := p.wait(t); code != 0 {
				t.Errorf("exit code = %d, want 0", code)
			}
		})
	}
}

type lazyString struct{ b *syncBuffer }

func (l lazyString) String() string { return l.b.String() }
