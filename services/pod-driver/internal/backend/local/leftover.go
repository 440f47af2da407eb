package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// Names of crash-recovery files.
const (
	// keptDirName holds the workspace of a lost watch workload between
	// the cleanup of its session directory and the start that serves it.
	keptDirName = ".kept"
	// driverFileName, in a session directory, names the driver identity
	// that created it.
	driverFileName = "driver"
)

func (b *Backend) keptPath(id string) string { return filepath.Join(b.root, keptDirName, id) }

// WorkspaceIntact reports whether session id has a workspace directory on
// this machine that a recovery can serve as it is, with every edit since
// the last checkpoint: it was left by a workload lost with its driver, its
// seed completed (the workspace marker, written last by the seed, exists),
// and lastDriver — the driver that served the session's workspace last, as
// the session record says — created it. A directory another driver
// created is stale: the session ran elsewhere since, and its checkpoint is
// newer.
func (b *Backend) WorkspaceIntact(id, lastDriver string) bool {
	if lastDriver == "" || b.isLive(id) {
		return false
	}
	dir := filepath.Join(b.root, id)
	stamp, err := os.ReadFile(filepath.Join(dir, driverFileName))
	if err != nil || strings.TrimSpace(string(stamp)) != lastDriver {
		return false
	}
	return regularFile(filepath.Join(dir, workspaceDirName, kernelwire.MarkerPath))
}

// clearLeftover prepares a start of session id on a machine where an
// earlier workload of it may have been lost with its driver: it ends the
// process groups recorded for the session (verified by start time) and
// removes the session directory. With keep it first moves the intact
// workspace aside and returns its path, for the new workload to serve
// instead of seeding; keep with no intact workspace is an error. With
// reuse (and not keep) a workspace directory left there, intact or not,
// is moved aside the same way, for the new workload to seed on top of:
// the seed makes it equal to what it restores and fetches none of the
// content it already holds. The caller owns the session and this backend
// does not run it.
func (b *Backend) clearLeftover(id string, keep, reuse bool) (kept string, err error) {
	if n := b.reapSession(id); n > 0 {
		b.log.Info("ended the process groups of a lost workload", "session", id, "groups", n)
	}
	dir := filepath.Join(b.root, id)
	if err := os.RemoveAll(b.keptPath(id)); err != nil {
		return "", fmt.Errorf("clear kept workspace: %w", err)
	}
	ws := filepath.Join(dir, workspaceDirName)
	if keep && !regularFile(filepath.Join(ws, kernelwire.MarkerPath)) {
		return "", errors.New("keep workspace: no intact workspace directory on this machine")
	}
	if fi, err := os.Lstat(ws); (keep || reuse) && err == nil && fi.IsDir() {
		kept = b.keptPath(id)
		if err := os.MkdirAll(filepath.Dir(kept), 0o700); err != nil {
			return "", fmt.Errorf("keep workspace: %w", err)
		}
		if err := os.Rename(ws, kept); err != nil {
			return "", fmt.Errorf("keep workspace: %w", err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("remove lost session directory: %w", err)
	}
	return kept, nil
}

// stampDriver records which driver created the session directory.
func (d sessionDir) stampDriver(driver string) error {
	if err := os.WriteFile(filepath.Join(d.root, driverFileName), []byte(driver+"\n"), 0o600); err != nil {
		return fmt.Errorf("create session directory: %w", err)
	}
	return nil
}

// removeIfOurs removes the session directory unless another driver's
// stamp is on it: a workload that lost its session to a driver on this
// machine (which serves the directory now) leaves it alone.
func (d sessionDir) removeIfOurs(owner string) error {
	if stamp, err := os.ReadFile(filepath.Join(d.root, driverFileName)); err == nil && strings.TrimSpace(string(stamp)) != owner {
		return nil
	}
	return d.remove()
}
