package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nuid"
	"golang.org/x/sys/unix"
)

// identitiesDirName holds one lock file per driver identity that ever ran
// on this work directory: <id>.lock, flock-held by the live driver that
// uses it. The kernel drops a flock when its process dies (kill -9
// included), so a lock that can be taken names a dead driver.
const identitiesDirName = ".drivers"

// identity is this driver's stable name on this machine.
type identity struct {
	ID string
	// Dead are the identities of drivers that ran on this work directory
	// and are dead now (their locks were free). Their owner keys may be
	// taken over at once, without waiting for them to expire.
	Dead []string

	own   *os.File
	locks []*os.File // Dead's locks, held until released
}

// claimIdentity picks this driver's identity. A fixed id
// (RUNNER_DRIVER_ID) is used as is, and fails when a live driver on this
// work directory holds it. Otherwise the first free lock is taken — the
// identity of a previous run of this driver, so a restarted driver
// recognises the owner keys that are its own — or a new identity is
// created. Every other free lock is a dead driver's, returned in Dead.
func claimIdentity(workDir, fixed string) (*identity, error) {
	dir := filepath.Join(workDir, identitiesDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("driver identity: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("driver identity: %w", err)
	}
	id := &identity{}
	if fixed != "" {
		f, ok, err := lockIdentity(dir, fixed, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("RUNNER_DRIVER_ID: %s is in use by a live driver on this work directory", fixed)
		}
		id.ID, id.own = fixed, f
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || name == "" || name == id.ID {
			continue
		}
		f, ok, err := lockIdentity(dir, name, false)
		if err != nil {
			id.release()
			return nil, err
		}
		if !ok {
			continue // a live driver
		}
		if id.own == nil {
			id.ID, id.own = name, f
			continue
		}
		id.Dead = append(id.Dead, name)
		id.locks = append(id.locks, f)
	}
	if id.own == nil {
		name := "driver-" + strings.ToLower(nuid.Next())
		f, ok, err := lockIdentity(dir, name, true)
		if err != nil || !ok {
			id.release()
			return nil, fmt.Errorf("driver identity: create %s: %v", name, err)
		}
		id.ID, id.own = name, f
	}
	return id, nil
}

// lockIdentity opens (with create, creates) dir/<name>.lock and tries to
// flock it. ok is false when a live process holds it, or when the file was
// removed meanwhile (a driver that took over the dead one deleted it).
func lockIdentity(dir, name string, create bool) (*os.File, bool, error) {
	path := filepath.Join(dir, name+".lock")
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("driver identity: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close() // read-only use
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("driver identity: lock %s: %w", name, err)
	}
	// The file may have been unlinked between open and lock: a lock on a
	// removed file names nothing.
	var held, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &now) != nil || held.Ino != now.Ino {
		_ = f.Close()
		return nil, false, nil
	}
	return f, true, nil
}

// forgetDead removes the dead identities' lock files (their owner keys
// were taken over) and drops their locks.
func (id *identity) forgetDead(workDir string) {
	for i, name := range id.Dead {
		_ = os.Remove(filepath.Join(workDir, identitiesDirName, name+".lock")) // best effort: a leftover is retried next boot
		_ = id.locks[i].Close()
	}
	id.Dead, id.locks = nil, nil
}

// release drops every lock; the identity file stays for the next run.
func (id *identity) release() {
	for _, f := range id.locks {
		_ = f.Close()
	}
	if id.own != nil {
		_ = id.own.Close()
	}
}
