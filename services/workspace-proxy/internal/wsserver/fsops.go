package wsserver

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// tempPrefix and tempSuffix frame the names of the server's own temporary
// files. The tree and snapshot never list such names, so a concurrent
// listing (or a crash mid-write) cannot leak a half-written file into a
// checkpoint.
const (
	tempPrefix = ".wsserver-"
	tempSuffix = ".tmp"
)

func isTempName(base string) bool {
	return strings.HasPrefix(base, tempPrefix) && strings.HasSuffix(base, tempSuffix)
}

// dir is the directory holding a path's last component, opened as its own
// os.Root, and that component's name.
type dir struct {
	*os.Root
	base  string
	owned bool // Opened for this path (not the server's root): close it.
}

func (d *dir) close() {
	if d.owned {
		_ = d.Close() // A directory handle: nothing to lose.
	}
}

// dirOf walks the directory components of name (a normalized path) one
// handle at a time, so each step is one lookup in an already-open
// directory and nothing is resolved from the top again. A component that
// is a symbolic link fails with errSymlink (and, should one be swapped in
// after the check, OpenRoot confines it to the directory above). A missing
// component is created when create is set and otherwise reported as
// fs.ErrNotExist, as is a non-directory when create is unset. The caller
// closes the result.
func (s *Server) dirOf(name string, create bool) (*dir, error) {
	cur := &dir{Root: s.root}
	for {
		i := strings.IndexByte(name, '/')
		if i < 0 {
			cur.base = name
			return cur, nil
		}
		seg := name[:i]
		name = name[i+1:]
		next, err := cur.enter(seg, create)
		cur.close()
		if err != nil {
			return nil, err
		}
		cur = &dir{Root: next, owned: true}
	}
}

// enter checks the directory seg of d (creating it when asked) and opens it.
func (d *dir) enter(seg string, create bool) (*os.Root, error) {
	fi, err := d.Lstat(seg)
	if errors.Is(err, fs.ErrNotExist) && create {
		err = d.Mkdir(seg, 0o755)
		if err == nil {
			return d.OpenRoot(seg)
		}
		if errors.Is(err, fs.ErrExist) {
			fi, err = d.Lstat(seg) // Lost a race with another writer: check what won.
		}
	}
	switch {
	case err != nil:
		return nil, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("%s: %w", seg, errSymlink)
	case !fi.IsDir() && create:
		return nil, fmt.Errorf("%s: not a directory", seg)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s: not a directory: %w", seg, fs.ErrNotExist)
	}
	return d.OpenRoot(seg)
}

// openRegular opens name for reading only if it is a regular file reached
// without any symbolic link: one in the directory part fails with
// errNotRegular (the tree does not list such a file either), and an Lstat
// of the name and the opened file must be the same regular file, which
// also catches a swap between the two. Files are opened non-blocking so a
// FIFO swapped in cannot hang the read.
func (s *Server) openRegular(name string) (*os.File, fs.FileInfo, error) {
	d, err := s.dirOf(name, false)
	if errors.Is(err, errSymlink) {
		return nil, nil, fmt.Errorf("%w: %w", errNotRegular, err)
	}
	if err != nil {
		return nil, nil, err
	}
	defer d.close()
	named, err := d.Lstat(d.base)
	if err != nil {
		return nil, nil, err
	}
	if !named.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: %w", name, errNotRegular)
	}
	f, err := d.OpenFile(d.base, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	opened, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	if !opened.Mode().IsRegular() || !os.SameFile(opened, named) {
		_ = f.Close()
		return nil, nil, fmt.Errorf("%s: changed while opening: %w", name, errNotRegular)
	}
	return f, opened, nil
}

// readRegular returns the bytes of the regular file at name (see
// openRegular) and its stat.
func (s *Server) readRegular(name string) ([]byte, fs.FileInfo, error) {
	f, fi, err := s.openRegular(name)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = f.Close() }() // Read-only: nothing to lose.
	buf := bytes.NewBuffer(make([]byte, 0, fi.Size()+bytes.MinRead))
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", name, err)
	}
	return buf.Bytes(), fi, nil
}

// writeAtomic replaces name with data: the bytes go to a temporary file in
// the same directory, which is then renamed over name, so readers and file
// watchers see either the old file or the complete new one (and a new
// inode). Missing parent directories are created; a symbolic link among
// them fails with errSymlink. An existing regular file keeps its
// permission bits; a symbolic link at name is replaced by the file, never
// followed. The data is not fsynced: the workspace is a scratch volume
// whose durable copy is the checkpoint.
func (s *Server) writeAtomic(name string, data []byte) error {
	return s.replace(name, data, nil, nil)
}

// writeMode is writeAtomic giving the file the permission bits mode
// instead of keeping the old file's (a checkpoint restore).
func (s *Server) writeMode(name string, data []byte, mode fs.FileMode) error {
	return s.replace(name, data, &mode, nil)
}

// touch rewrites the file described by was (as read moments ago) with its
// own bytes, data. If the file changed in between, someone else's write
// already gave the watchers their event, so touch leaves it alone rather
// than put the old bytes back.
func (s *Server) touch(name string, data []byte, was fs.FileInfo) error {
	return s.replace(name, data, nil, was)
}

// replace is writeAtomic; a non-nil mode sets the permission bits, and
// with a non-nil guard the final rename happens only while name is still
// that file, unmodified.
func (s *Server) replace(name string, data []byte, mode *fs.FileMode, guard fs.FileInfo) error {
	d, err := s.dirOf(name, true)
	if err != nil {
		return err
	}
	defer d.close()
	perm := fs.FileMode(0o644)
	switch fi, err := d.Lstat(d.base); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("%s: is a directory", name)
	case fi.Mode().IsRegular():
		perm = fi.Mode().Perm()
	}
	if mode != nil {
		perm = *mode
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails.
	tmp := tempPrefix + hex.EncodeToString(rnd[:]) + tempSuffix
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm) // Undo the umask so a rewrite keeps the mode exactly.
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && guard != nil {
		if now, lerr := d.Lstat(d.base); lerr != nil || !sameVersion(now, guard) {
			_ = d.Remove(tmp)
			return nil
		}
	}
	if err == nil {
		err = d.Rename(tmp, d.base)
	}
	if err != nil {
		_ = d.Remove(tmp) // Best effort: the name is never listed anyway.
		return err
	}
	return nil
}

// remove deletes name and everything below it. Already absent (including
// a non-directory in the directory part) is success. A symbolic link at
// name is removed itself; one in the directory part fails with errSymlink.
func (s *Server) remove(name string) error {
	d, err := s.dirOf(name, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.close()
	return d.RemoveAll(d.base)
}

// sameVersion reports whether a and b describe the same file with the same
// size and modification time.
func sameVersion(a, b fs.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
