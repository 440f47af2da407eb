package wsserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/telorunner/telorunner/pkg/parallel"
)

// entry is one regular file found by a walk.
type entry struct {
	path string
	info fs.FileInfo // Lstat at listing time.
}

// treeFile is one file of a tree: path and lowercase hex SHA-256 (the
// listing's JSON), plus the size and permission bits the tree nodes
// record (GET /workspace/node).
type treeFile struct {
	Path string `json:"path"`
	Hash string `json:"hash"`
	size int64
	mode uint32
}

// list walks the root and returns every regular file sorted by path in
// byte order. Entries whose base name is excluded are skipped at any depth
// (a directory with its whole subtree), symbolic links are neither
// followed nor listed, and the server's own temporary files are skipped.
// Entries that vanish during the walk are skipped.
func (s *Server) list(ctx context.Context) ([]entry, error) {
	var out []entry
	err := fs.WalkDir(s.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if err != nil {
			// Only a directory read fails here (the root's included).
			if p != "." && (s.concurrentChange(err) || s.notDir(p)) {
				return nil // Removed, or replaced by a link, while we walked.
			}
			return err
		}
		if p == "." {
			return nil
		}
		if s.exclude[d.Name()] {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || isTempName(d.Name()) {
			return nil // Directories are descended; links and specials skipped.
		}
		// Not d.Info(): that stats by path string, outside the os.Root.
		info, err := s.root.Lstat(p)
		if s.concurrentChange(err) {
			return nil
		}
		if err != nil {
			return err
		}
		out = append(out, entry{path: p, info: info})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk workspace: %w", err)
	}
	// WalkDir visits "a/b" before "a-b", byte order wants the reverse.
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.path, b.path) })
	return out, nil
}

// concurrentChange reports whether err, met on an entry a walk listed
// moments ago, is explained by the tree changing under the walk: the entry
// vanished, stopped being a regular file or directory, or a directory on
// its path became a symbolic link that os.Root refuses to follow out of
// the root. Such entries are left out of the listing; any other error
// (permissions, I/O, descriptors) fails it, so a checkpoint never silently
// misses a file that is there.
func (s *Server) concurrentChange(err error) bool {
	return err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotRegular) ||
		errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) ||
		(s.errEscapes != nil && errors.Is(err, s.errEscapes)))
}

// notDir reports whether p, listed as a directory moments ago, no longer
// is one (removed, or replaced by a file or symbolic link).
func (s *Server) notDir(p string) bool {
	fi, err := s.root.Lstat(p)
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || (err == nil && !fi.IsDir())
}

// tree lists the workspace and hashes every file, reusing cached hashes of
// files whose identity and timestamps have not changed. Files that vanish
// or stop being regular files before they are hashed are left out.
func (s *Server) tree(ctx context.Context) ([]treeFile, error) {
	start := s.now()
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	hashes := make([]string, len(entries))
	stamps := make([]stamp, len(entries))
	sizes := make([]int64, len(entries))
	modes := make([]uint32, len(entries))
	var misses []int
	s.hashes.mu.Lock()
	for i, e := range entries {
		if h, ok := s.hashes.lookupLocked(e.path, e.info); ok {
			hashes[i], sizes[i], modes[i] = h, e.info.Size(), uint32(e.info.Mode().Perm())
		} else {
			misses = append(misses, i)
		}
	}
	s.hashes.mu.Unlock()

	err = parallel.Do(ctx, len(misses), readConcurrency, func(_ context.Context, k int) error {
		i := misses[k]
		h, st, err := s.hashFile(entries[i].path)
		if s.concurrentChange(err) {
			return nil // Gone or replaced by a link: hashes[i] stays "".
		}
		if err != nil {
			return err
		}
		hashes[i], stamps[i], sizes[i], modes[i] = h.hash, st, h.size, h.mode
		return nil
	})
	if err != nil {
		return nil, err
	}

	files := make([]treeFile, 0, len(entries))
	for i, e := range entries {
		if hashes[i] != "" {
			files = append(files, treeFile{Path: e.path, Hash: hashes[i], size: sizes[i], mode: modes[i]})
		}
	}
	s.hashes.mu.Lock()
	for _, k := range misses {
		if hashes[k] != "" {
			s.hashes.storeLocked(entries[k].path, stamps[k], hashes[k], start)
		}
	}
	s.hashes.indexLocked(files)
	s.hashes.mu.Unlock()
	return files, nil
}

// hashed is what hashFile read: the hash and size of the bytes, and the
// permission bits of the file they came from.
type hashed struct {
	hash string
	size int64
	mode uint32
}

// hashFile hashes the regular file at name and returns the stamp of the
// file it actually read.
func (s *Server) hashFile(name string) (hashed, stamp, error) {
	f, fi, err := s.openRegular(name)
	if err != nil {
		return hashed{}, stamp{}, err
	}
	defer func() { _ = f.Close() }() // Read-only: nothing to lose.
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return hashed{}, stamp{}, fmt.Errorf("hash %s: %w", name, err)
	}
	st, _ := stampOf(fi)
	return hashed{hash: hex.EncodeToString(h.Sum(nil)), size: n, mode: uint32(fi.Mode().Perm())}, st, nil
}

// snapshotFile is one file of a snapshot; Content is base64 on the wire.
type snapshotFile struct {
	Path     string `json:"path"`
	Hash     string `json:"hash"`
	Content  []byte `json:"content"`
	Encoding string `json:"encoding"`
}

// snapshot lists the workspace and reads every file (readConcurrency at a
// time); each hash is computed from the bytes returned, never the cache.
func (s *Server) snapshot(ctx context.Context) ([]snapshotFile, error) {
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	files := make([]snapshotFile, len(entries))
	err = parallel.Do(ctx, len(entries), readConcurrency, func(_ context.Context, i int) error {
		data, _, err := s.readRegular(entries[i].path)
		if s.concurrentChange(err) {
			return nil
		}
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		files[i] = snapshotFile{Path: entries[i].path, Hash: hex.EncodeToString(sum[:]), Content: data, Encoding: "base64"}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(files, func(f snapshotFile) bool { return f.Path == "" }), nil
}

// blob returns the bytes of a listed workspace file whose SHA-256 is hash
// (lowercase hex). It looks in the index of the last tree first and walks
// again once when that misses or is stale.
func (s *Server) blob(ctx context.Context, hash string) ([]byte, error) {
	for attempt := 0; attempt < 2; attempt++ {
		if attempt > 0 {
			if _, err := s.tree(ctx); err != nil {
				return nil, walkFailure(err)
			}
		}
		s.hashes.mu.Lock()
		p, ok := s.hashes.byHash[hash]
		s.hashes.mu.Unlock()
		if !ok {
			continue
		}
		data, _, err := s.readRegular(p)
		if s.concurrentChange(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) == hash {
			return data, nil
		}
	}
	return nil, notFound("no workspace file has hash " + hash)
}

// racyWindow: a file modified this close to the start of a hash pass may
// be modified again within the same timestamp tick without its stamp
// changing, so its hash is not cached (git's "racy clean" rule).
const racyWindow = 2 * time.Second

// hashCache remembers file hashes by path and stamp, and the path of each
// hash seen by the last tree (for blob lookups).
type hashCache struct {
	mu     sync.Mutex
	byPath map[string]cachedHash
	byHash map[string]string
}

type cachedHash struct {
	stamp stamp
	hash  string
}

func newHashCache() *hashCache {
	return &hashCache{byPath: map[string]cachedHash{}, byHash: map[string]string{}}
}

func (c *hashCache) lookupLocked(p string, fi fs.FileInfo) (string, bool) {
	st, ok := stampOf(fi)
	if !ok {
		return "", false
	}
	ch, ok := c.byPath[p]
	if !ok || ch.stamp != st {
		return "", false
	}
	return ch.hash, true
}

func (c *hashCache) storeLocked(p string, st stamp, hash string, start time.Time) {
	if !st.valid || st.changed > start.Add(-racyWindow).UnixNano() {
		delete(c.byPath, p)
		return
	}
	c.byPath[p] = cachedHash{stamp: st, hash: hash}
}

// indexLocked makes files the current listing: it rebuilds the hash index
// and forgets cached paths no longer present.
func (c *hashCache) indexLocked(files []treeFile) {
	present := make(map[string]bool, len(files))
	byHash := make(map[string]string, len(files))
	for _, f := range files {
		present[f.Path] = true
		if _, dup := byHash[f.Hash]; !dup {
			byHash[f.Hash] = f.Path
		}
	}
	for p := range c.byPath {
		if !present[p] {
			delete(c.byPath, p)
		}
	}
	c.byHash = byHash
}
