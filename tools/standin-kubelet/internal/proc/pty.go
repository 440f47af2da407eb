package proc

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// openPTY opens a pty sized 80x24. The master is returned in non-blocking
// mode so that closing it ends a pending read; its size is changed through
// setSize, never through os.File.Fd, which would make it blocking again.
func openPTY() (master, slave *os.File, err error) {
	m, slave, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	// pty.Open used m.Fd(), which leaves m blocking and outside the
	// poller; a non-blocking duplicate is registered with it.
	fd, err := unix.Dup(int(m.Fd()))
	_ = m.Close()
	if err == nil {
		unix.CloseOnExec(fd)
		err = unix.SetNonblock(fd, true)
		if err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		_ = slave.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := setSize(master, Size{Width: 80, Height: 24}); err != nil {
		_ = master.Close()
		_ = slave.Close()
		return nil, nil, fmt.Errorf("size pty: %w", err)
	}
	return master, slave, nil
}

// setSize sets the terminal size of a pty master. It is safe to call
// concurrently with Close.
func setSize(master *os.File, sz Size) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: sz.Height, Col: sz.Width})
	})
	if err != nil {
		return err
	}
	return ioErr
}
