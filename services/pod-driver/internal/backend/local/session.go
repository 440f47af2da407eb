package local

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Names inside a session directory.
const (
	appDirName       = "app"       // run sessions: the bundle
	workspaceDirName = "workspace" // watch sessions: the shared workspace
	homeDirName      = "home"
	pidFileName      = "pid"
)

// sessionDir is one session's directory under the work root.
type sessionDir struct {
	root string // <WorkRoot>/<sessionId>, absolute
}

func (d sessionDir) app() string       { return filepath.Join(d.root, appDirName) }
func (d sessionDir) workspace() string { return filepath.Join(d.root, workspaceDirName) }
func (d sessionDir) home() string      { return filepath.Join(d.root, homeDirName) }

// entry is the absolute path of a bundle entry inside app/. rel must be
// normalized (contract.NormalizePath).
func (d sessionDir) entry(rel string) string {
	return filepath.Join(d.app(), filepath.FromSlash(rel))
}

// createSessionDir makes <workRoot>/<id> with home/ and content (app/ for
// a run session, workspace/ for a watch session). It fails if the directory
// already exists: a live or adoptable session may own it.
func createSessionDir(workRoot, id, content string) (sessionDir, error) {
	d := sessionDir{root: filepath.Join(workRoot, id)}
	if err := os.Mkdir(d.root, 0o700); err != nil {
		return sessionDir{}, fmt.Errorf("create session directory: %w", err)
	}
	for _, sub := range []string{filepath.Join(d.root, content), d.home()} {
		if err := os.Mkdir(sub, 0o755); err != nil {
			_ = os.RemoveAll(d.root) // undoing our own fresh directory
			return sessionDir{}, fmt.Errorf("create session directory: %w", err)
		}
	}
	return d, nil
}

// writeBundle places the bundle's files under app/ (contract 8.1): every
// path goes through contract.NormalizePath, base64 contents are decoded,
// parent directories are created and a later duplicate overwrites an
// earlier one. Writes go through an os.Root, so even a path that slipped
// past normalization cannot leave app/.
func (d sessionDir) writeBundle(files []contract.BundleFile) error {
	root, err := os.OpenRoot(d.app())
	if err != nil {
		return fmt.Errorf("open bundle root: %w", err)
	}
	defer func() { _ = root.Close() }() // a directory handle; nothing to flush
	for _, f := range files {
		rel, err := contract.NormalizePath(f.RelativePath)
		if err != nil {
			return err
		}
		data := []byte(f.Contents)
		if f.Encoding == "base64" {
			if data, err = base64.StdEncoding.DecodeString(f.Contents); err != nil {
				return fmt.Errorf("decode bundle file %s: %w", rel, err)
			}
		}
		if dir := path.Dir(rel); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("write bundle file %s: %w", rel, err)
			}
		}
		if err := root.WriteFile(rel, data, 0o644); err != nil {
			return fmt.Errorf("write bundle file %s: %w", rel, err)
		}
	}
	return nil
}

// writePIDs records the process group id of each process of the session,
// one per line (run sessions: in app order; watch sessions: the workspace
// server, the running app kernels in app order, the agent), for adoption
// after a driver restart.
func (d sessionDir) writePIDs(pgids []int) error {
	var b strings.Builder
	for _, id := range pgids {
		b.WriteString(strconv.Itoa(id))
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(d.root, pidFileName), []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// remove deletes the session directory and everything in it.
func (d sessionDir) remove() error {
	if err := os.RemoveAll(d.root); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove session directory: %w", err)
	}
	return nil
}
