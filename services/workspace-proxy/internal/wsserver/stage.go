package wsserver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

// Staged writes: a file too large for one bus message reaches the server
// in chunks (POST /workspace/stage), written into a temporary file beside
// its destination that no listing shows; a later change set names the
// upload (write[].staged) and the whole file is renamed into place then,
// so no reader or file watcher ever sees part of it.

// uploadIdle is how long an upload nobody adds to or commits is kept; an
// older one is removed at the next stage request.
const uploadIdle = 10 * time.Minute

// uploads is the server's table of staged files (zero value ready).
type uploads struct {
	mu sync.Mutex
	m  map[string]*upload
}

// upload is one staged file. mu serializes its file I/O.
type upload struct {
	mu      sync.Mutex
	path    string // the destination, normalized
	size    int64
	touched time.Time
}

// uploadName is the temporary name of upload id in its destination's
// directory: a server temporary name (isTempName), never listed.
func uploadName(id string) string { return tempPrefix + "up-" + id + tempSuffix }

// validUploadID accepts 16 to 64 lowercase hex digits.
func validUploadID(id string) bool {
	if len(id) < 16 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// postStage is POST /workspace/stage?upload=<id>&path=<p>&offset=<n> with
// the raw bytes as body: they are written at offset of the upload (a new
// upload starts at 0; an offset past its end is refused, so a retried
// chunk is harmless). Answers {"size": <staged bytes>}.
func (s *Server) postStage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	id := q.Get("upload")
	if !validUploadID(id) {
		return badRequest("upload: want 16 to 64 lowercase hex digits")
	}
	p, offset, err := pathOffset(q)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return &apiError{status: http.StatusRequestEntityTooLarge, code: wsapi.CodeTooLarge, msg: fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)}
	case err != nil:
		return badRequest("body: " + err.Error())
	}
	u, err := s.uploadFor(id, p, offset)
	if err != nil {
		return err
	}
	defer u.mu.Unlock()
	if offset > u.size {
		return badRequest(fmt.Sprintf("upload %s: offset %d is past its %d staged bytes", id, offset, u.size))
	}
	d, err := s.dirOf(p, true)
	if err != nil {
		return fsFailure(wsapi.CodeWriteFailed, fmt.Errorf("stage %s: %w", p, err))
	}
	defer d.close()
	f, err := d.OpenFile(uploadName(id), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fsFailure(wsapi.CodeWriteFailed, fmt.Errorf("stage %s: %w", p, err))
	}
	_, err = f.WriteAt(data, offset)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fsFailure(wsapi.CodeWriteFailed, fmt.Errorf("stage %s: %w", p, err))
	}
	u.size = max(u.size, offset+int64(len(data)))
	u.touched = s.now()
	writeJSON(w, http.StatusOK, map[string]int64{"size": u.size})
	return nil
}

// uploadFor returns upload id for path p, locked, creating it when offset
// is 0; it first drops uploads idle for longer than uploadIdle.
func (s *Server) uploadFor(id, p string, offset int64) (*upload, error) {
	now := s.now()
	type staleFile struct{ path, id string }
	var stale []staleFile
	s.uploads.mu.Lock()
	if s.uploads.m == nil {
		s.uploads.m = map[string]*upload{}
	}
	for k, u := range s.uploads.m {
		if k != id && u.mu.TryLock() { // A busy upload is not idle.
			if now.Sub(u.touched) > uploadIdle {
				delete(s.uploads.m, k)
				stale = append(stale, staleFile{u.path, k})
			}
			u.mu.Unlock()
		}
	}
	u, ok := s.uploads.m[id]
	var err error
	switch {
	case !ok && offset != 0:
		err = badRequest(fmt.Sprintf("upload %s is unknown (expired, committed or never started at offset 0)", id))
	case !ok:
		u = &upload{path: p, touched: now}
		s.uploads.m[id] = u
	case u.path != p:
		err = badRequest(fmt.Sprintf("upload %s is for another path", id))
	}
	s.uploads.mu.Unlock()
	for _, f := range stale {
		s.discardFile(f.path, f.id)
	}
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	return u, nil
}

// discardFile removes upload id's temporary file beside p, if any.
func (s *Server) discardFile(p, id string) {
	d, err := s.dirOf(p, false)
	if err != nil {
		return // No directory, no file.
	}
	defer d.close()
	_ = d.Remove(uploadName(id)) // Already absent is fine; never listed anyway.
}

// deleteStage is DELETE /workspace/stage?upload=<id>: drop an upload.
func (s *Server) deleteStage(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("upload")
	if !validUploadID(id) {
		return badRequest("upload: want 16 to 64 lowercase hex digits")
	}
	s.uploads.mu.Lock()
	u, ok := s.uploads.m[id]
	delete(s.uploads.m, id)
	s.uploads.mu.Unlock()
	if ok {
		u.mu.Lock()
		s.discardFile(u.path, id)
		u.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, map[string]bool{"discarded": ok})
	return nil
}

// checkStaged reports whether upload id exists for path p.
func (s *Server) checkStaged(id, p string) error {
	s.uploads.mu.Lock()
	u, ok := s.uploads.m[id]
	s.uploads.mu.Unlock()
	if !ok || u.path != p {
		return badRequest(fmt.Sprintf("staged upload %s for %s is unknown (expired or never staged)", id, p))
	}
	return nil
}

// commitStaged renames upload id into place at name with mode, or when
// mode is nil the mode of a regular file it replaces (as writeAtomic and
// writeMode do).
func (s *Server) commitStaged(name, id string, mode *fs.FileMode) error {
	s.uploads.mu.Lock()
	u, ok := s.uploads.m[id]
	if ok && u.path == name {
		delete(s.uploads.m, id)
	}
	s.uploads.mu.Unlock()
	if !ok || u.path != name {
		return badRequest(fmt.Sprintf("staged upload %s for %s is unknown (expired or never staged)", id, name))
	}
	u.mu.Lock() // A chunk still being written finishes first.
	defer u.mu.Unlock()
	d, err := s.dirOf(name, true)
	if err != nil {
		return err
	}
	defer d.close()
	tmp := uploadName(id)
	perm := fs.FileMode(0o644)
	switch fi, err := d.Lstat(d.base); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		_ = d.Remove(tmp)
		return err
	case fi.IsDir():
		_ = d.Remove(tmp)
		return fmt.Errorf("%s: is a directory", name)
	case fi.Mode().IsRegular():
		perm = fi.Mode().Perm()
	}
	if mode != nil {
		perm = *mode
	}
	if err := d.Chmod(tmp, perm); err != nil {
		_ = d.Remove(tmp)
		return err
	}
	if err := d.Rename(tmp, d.base); err != nil {
		_ = d.Remove(tmp)
		return err
	}
	return nil
}
