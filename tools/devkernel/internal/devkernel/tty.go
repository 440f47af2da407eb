package devkernel

import (
	"io"

	"golang.org/x/sys/unix"
)

// fder is implemented by *os.File.
type fder interface{ Fd() uintptr }

// isTerminal reports whether w is a terminal (the termios ioctl succeeds).
func isTerminal(w io.Writer) bool {
	f, ok := w.(fder)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlReadTermios)
	return err == nil
}

// useColour applies the banner's colour rule: a terminal or a CLICOLOR_FORCE
// that is set and not "0" turns colour on; a non-empty NO_COLOR turns it off.
func useColour(tty bool, getenv func(string) string) bool {
	if getenv("NO_COLOR") != "" {
		return false
	}
	force := getenv("CLICOLOR_FORCE")
	return tty || (force != "" && force != "0")
}
