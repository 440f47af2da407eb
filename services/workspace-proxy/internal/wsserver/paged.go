package wsserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/telorunner/telorunner/pkg/parallel"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// Paged reads: the runner moves a workspace through a message bus whose
// messages are bounded (NATS: 1 MB by default), so besides the whole-tree
// and whole-file routes of contract 9.2 the server answers bounded pages of
// both, each stamped so that the reader can tell a file changed under it.
const (
	// MaxRangeBytes bounds one GET /workspace/range.
	MaxRangeBytes = 4 << 20
	// defaultPageFiles and defaultPageBytes bound a tree page whose request
	// names no limit; maxPageFiles and maxPageBytes bound any.
	defaultPageFiles = 5000
	defaultPageBytes = 256 << 10
	maxPageFiles     = 100_000
	maxPageBytes     = 16 << 20
)

// Headers of a GET /workspace/range answer.
const (
	HeaderSize  = wsapi.HeaderSize  // the whole file's size in bytes
	HeaderStamp = wsapi.HeaderStamp // the file's version (stampString)
)

// stampString is an opaque version of a file: identity, size and change
// times where the platform has them, else size and modification time.
func stampString(fi fs.FileInfo) string {
	if st, ok := stampOf(fi); ok {
		return fmt.Sprintf("%x-%x-%x-%x-%x", st.dev, st.ino, st.size, st.mtime, st.changed)
	}
	return fmt.Sprintf("%x-%x", fi.Size(), fi.ModTime().UnixNano())
}

// getRange is GET /workspace/range?path=<p>&offset=<n>&length=<n>: the raw
// bytes of the range (fewer at the end of the file, none past it), with
// the file's size and stamp in headers. A file that changes while the
// range is read answers 409 file_changed.
func (s *Server) getRange(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p, offset, err := pathOffset(q)
	if err != nil {
		return err
	}
	length, err := intParam(q.Get("length"), MaxRangeBytes, 0, MaxRangeBytes)
	if err != nil {
		return badRequest("length: " + err.Error())
	}
	f, fi, err := s.openRegular(p)
	if err != nil {
		return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("read %s: %w", p, err))
	}
	defer func() { _ = f.Close() }() // Read-only: nothing to lose.
	stamp := stampString(fi)
	n := min(length, max(fi.Size()-offset, 0))
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("read %s: %w", p, err))
	}
	after, err := f.Stat()
	if err != nil {
		return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("read %s: %w", p, err))
	}
	if int64(got) != n || stampString(after) != stamp {
		return &apiError{status: http.StatusConflict, code: wsapi.CodeFileChanged, msg: p + " changed while it was read"}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set(HeaderSize, strconv.FormatInt(fi.Size(), 10))
	w.Header().Set(HeaderStamp, stamp)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf) // The client went away; nothing left to tell it.
	return nil
}

// intParam parses an optional integer query value within [lo, hi].
func intParam(raw string, def, lo, hi int64) (int64, error) {
	if raw == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("want an integer from %d to %d, got %q", lo, hi, raw)
	}
	return v, nil
}

// getTreePage is GET /workspace/treepage?after=<path>&limit=<n>&bytes=<n>:
// the files of the tree (contract 9.2: same exclusions, hashes and byte
// order) that sort after `after`, at most limit of them and about bytes of
// JSON, and whether more follow: {"files":[...],"more":bool}. Each page
// is listed afresh, so a walk page by page sees every file present
// throughout, once and in order.
func (s *Server) getTreePage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := intParam(q.Get("limit"), defaultPageFiles, 1, maxPageFiles)
	if err != nil {
		return badRequest("limit: " + err.Error())
	}
	budget, err := intParam(q.Get("bytes"), defaultPageBytes, 1, maxPageBytes)
	if err != nil {
		return badRequest("bytes: " + err.Error())
	}
	files, more, err := s.treePage(r.Context(), q.Get("after"), int(limit), int(budget))
	if err != nil {
		return walkFailure(err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"files": files, "more": more})
	return nil
}

// treePage lists the tree and hashes only the files of one page (cached
// hashes reused, as by tree). At least one file is returned while any
// remains, whatever the byte budget.
func (s *Server) treePage(ctx context.Context, after string, limit, budget int) ([]treeFile, bool, error) {
	start := s.now()
	entries, err := s.list(ctx)
	if err != nil {
		return nil, false, err
	}
	i := sort.Search(len(entries), func(i int) bool { return entries[i].path > after })
	files := []treeFile{}
	used := 0
	for i < len(entries) && len(files) < limit && (used < budget || len(files) == 0) {
		// Take the candidates that fit, hash them, keep those still there.
		j, room := i, used
		for j < len(entries) && len(files)+(j-i) < limit && (room < budget || j == i) {
			room += jsonSize(entries[j].path)
			j++
		}
		hashes, err := s.hashEntries(ctx, entries[i:j], start)
		if err != nil {
			return nil, false, err
		}
		for k, h := range hashes {
			if h != "" {
				files = append(files, treeFile{Path: entries[i+k].path, Hash: h})
				used += jsonSize(entries[i+k].path)
			}
		}
		i = j
	}
	return files, i < len(entries), nil
}

// jsonSize is an upper bound of one tree entry's JSON size.
func jsonSize(p string) int {
	n := len(`{"path":"","hash":""},`) + 64
	for i := 0; i < len(p); {
		c, size := utf8.DecodeRuneInString(p[i:])
		switch {
		case c < 0x20 || c == '"' || c == '\\' || c == utf8.RuneError || c == 0x2028 || c == 0x2029:
			n += 6 // \u00XX at worst
		default:
			n += size
		}
		i += size
	}
	return n
}

// hashEntries hashes entries (cache first) and returns their hashes in
// order, "" for a file that vanished or stopped being a regular file.
func (s *Server) hashEntries(ctx context.Context, entries []entry, start time.Time) ([]string, error) {
	hashes := make([]string, len(entries))
	stamps := make([]stamp, len(entries))
	var misses []int
	s.hashes.mu.Lock()
	for i, e := range entries {
		if h, ok := s.hashes.lookupLocked(e.path, e.info); ok {
			hashes[i] = h
		} else {
			misses = append(misses, i)
		}
	}
	s.hashes.mu.Unlock()
	err := parallel.Do(ctx, len(misses), readConcurrency, func(_ context.Context, k int) error {
		i := misses[k]
		h, st, err := s.hashFile(entries[i].path)
		if s.concurrentChange(err) {
			return nil
		}
		if err != nil {
			return err
		}
		hashes[i], stamps[i] = h.hash, st
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.hashes.mu.Lock()
	for _, k := range misses {
		if hashes[k] != "" {
			s.hashes.storeLocked(entries[k].path, stamps[k], hashes[k], start)
		}
	}
	s.hashes.mu.Unlock()
	return hashes, nil
}

// pathOffset reads the ?path= (required, normalized) and ?offset= (0 when
// absent) of a range read or a stage.
func pathOffset(q url.Values) (string, int64, error) {
	if q.Get("path") == "" {
		return "", 0, badPath("?path= is required")
	}
	p, err := normalize(q.Get("path"))
	if err != nil {
		return "", 0, err
	}
	offset, err := intParam(q.Get("offset"), 0, 0, 1<<62)
	if err != nil {
		return "", 0, badRequest("offset: " + err.Error())
	}
	return p, offset, nil
}
