package wsserver

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

func (s *Server) routes() {
	s.mux.HandleFunc("GET "+wsapi.RouteHealth, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET "+wsapi.RouteTree, s.handle(s.getTree))
	s.mux.HandleFunc("POST "+wsapi.RouteTree, s.handle(s.writing(s.postApply)))
	s.mux.HandleFunc("GET "+wsapi.RouteFile, s.handle(s.getFile))
	s.mux.HandleFunc("GET "+wsapi.RouteSnapshot, s.handle(s.getSnapshot))
	s.mux.HandleFunc("GET "+wsapi.RouteBlob+"{hash}", s.handle(s.getBlob))
	s.mux.HandleFunc("GET "+wsapi.RouteNode, s.handle(s.getRoot))
	s.mux.HandleFunc("GET "+wsapi.RouteNode+"/{hash}", s.handle(s.getNode))
	s.mux.HandleFunc("POST "+wsapi.RouteTouch, s.handle(s.writing(s.postTouch)))
	s.mux.HandleFunc("POST "+wsapi.RouteFreeze, s.handle(s.postFreeze))
	s.mux.HandleFunc("GET "+wsapi.RouteTreePage, s.handle(s.getTreePage))
	s.mux.HandleFunc("GET "+wsapi.RouteRange, s.handle(s.getRange))
	s.mux.HandleFunc("POST "+wsapi.RouteStage, s.handle(s.writing(s.postStage)))
	s.mux.HandleFunc("DELETE "+wsapi.RouteStage, s.handle(s.deleteStage))
}

// handle adapts a handler that reports failure by returning an error.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// writing runs a write under the freeze lock, refusing it while frozen.
func (s *Server) writing(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		s.writes.RLock()
		defer s.writes.RUnlock()
		if s.frozen {
			return &apiError{status: http.StatusConflict, code: wsapi.CodeFrozen, msg: "the workspace is frozen (the session is being suspended): it takes no writes"}
		}
		return h(w, r)
	}
}

// postFreeze is POST /workspace/freeze {"frozen": bool}: it answers once
// every write in flight has finished.
func (s *Server) postFreeze(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Frozen *bool `json:"frozen"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Frozen == nil {
		return badRequest("frozen: required")
	}
	s.writes.Lock()
	s.frozen = *body.Frozen
	s.writes.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"frozen": *body.Frozen})
	return nil
}

// maxPathBytes bounds a normalized path (Linux PATH_MAX), which also
// bounds how deep one request can make the tree.
const maxPathBytes = 4096

// normalize applies contract 8.2 and the length bound; failures are 400
// invalid_path.
func normalize(p string) (string, error) {
	n, err := contract.NormalizePath(p)
	if err != nil {
		return "", badPath(err.Error())
	}
	if len(n) > maxPathBytes {
		return "", badPath(fmt.Sprintf("path is %d bytes, the limit is %d", len(n), maxPathBytes))
	}
	return n, nil
}

func (s *Server) getTree(w http.ResponseWriter, r *http.Request) error {
	files, err := s.tree(r.Context())
	if err != nil {
		return walkFailure(err)
	}
	writeJSON(w, http.StatusOK, map[string][]treeFile{"files": files})
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	files, err := s.snapshot(r.Context())
	if err != nil {
		return walkFailure(err)
	}
	writeJSON(w, http.StatusOK, map[string][]snapshotFile{"files": files})
	return nil
}

// changeSet is the body of POST /workspace. Pointers tell a missing
// field from an empty one. A write's mode (permission bits, 0 to 0777) is
// internal to the runner (a checkpoint restore): the /v1 change set has
// none, and without one a rewritten file keeps its mode, a new one 0644.
type changeSet struct {
	Write []struct {
		Path     *string `json:"path"`
		Content  *string `json:"content"`
		Encoding string  `json:"encoding"`
		Mode     *uint32 `json:"mode"`
		// Staged names an upload (stage.go) holding the content.
		Staged string `json:"staged"`
	} `json:"write"`
	Delete []*string `json:"delete"`
}

// write is one validated write: normalized path, decoded bytes (or the
// upload holding them) and the mode asked for (nil: keep or default).
type write struct {
	path   string
	data   []byte
	mode   *fs.FileMode
	staged string
}

// postApply validates the whole change set first (so a bad path or body
// changes nothing), then applies every write in order and every delete in
// order, stopping at the first failure with earlier operations applied.
func (s *Server) postApply(w http.ResponseWriter, r *http.Request) error {
	var cs changeSet
	if err := decodeBody(w, r, &cs); err != nil {
		return err
	}
	writes := make([]write, len(cs.Write))
	for i, op := range cs.Write {
		var mode *fs.FileMode
		if op.Mode != nil {
			if *op.Mode > merkle.MaxMode {
				return badRequest(fmt.Sprintf("write[%d]: mode %o: only permission bits (at most 0777)", i, *op.Mode))
			}
			m := fs.FileMode(*op.Mode)
			mode = &m
		}
		if op.Staged != "" {
			if op.Path == nil || (op.Content != nil && *op.Content != "") {
				return badRequest(fmt.Sprintf("write[%d]: a staged write has a path and no content", i))
			}
			p, err := normalize(*op.Path)
			if err != nil {
				return err
			}
			if err := s.checkStaged(op.Staged, p); err != nil {
				return err
			}
			writes[i] = write{path: p, staged: op.Staged, mode: mode}
			continue
		}
		if op.Path == nil || op.Content == nil {
			return badRequest(fmt.Sprintf("write[%d]: path and content are required", i))
		}
		p, err := normalize(*op.Path)
		if err != nil {
			return err
		}
		data, err := decodeContent(*op.Content, op.Encoding)
		if err != nil {
			return badRequest(fmt.Sprintf("write[%d]: %v", i, err))
		}
		writes[i] = write{path: p, data: data, mode: mode}
	}
	deletes := make([]string, len(cs.Delete))
	for i, d := range cs.Delete {
		if d == nil {
			return badRequest(fmt.Sprintf("delete[%d]: must be a string", i))
		}
		p, err := normalize(*d)
		if err != nil {
			return err
		}
		deletes[i] = p
	}
	for _, wr := range writes {
		var err error
		switch {
		case wr.staged != "":
			err = s.commitStaged(wr.path, wr.staged, wr.mode)
		case wr.mode != nil:
			err = s.writeMode(wr.path, wr.data, *wr.mode)
		default:
			err = s.writeAtomic(wr.path, wr.data)
		}
		if err != nil {
			return fsFailure(wsapi.CodeWriteFailed, fmt.Errorf("write %s: %w", wr.path, err))
		}
	}
	for _, p := range deletes {
		if err := s.remove(p); err != nil {
			return fsFailure(wsapi.CodeDeleteFailed, fmt.Errorf("delete %s: %w", p, err))
		}
	}
	writeJSON(w, http.StatusOK, map[string]int{"written": len(writes), "deleted": len(deletes)})
	return nil
}

func decodeContent(content, encoding string) ([]byte, error) {
	switch encoding {
	case "", "utf8":
		return []byte(content), nil
	case "base64":
		data, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, fmt.Errorf("content is not base64: %w", err)
		}
		return data, nil
	default:
		return nil, fmt.Errorf("encoding %q: want utf8 or base64", encoding)
	}
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	raw := q.Get("path")
	if raw == "" {
		return badPath("?path= is required")
	}
	p, err := normalize(raw)
	if err != nil {
		return err
	}
	encoding := q.Get("encoding")
	if encoding != "" && encoding != "utf8" && encoding != "base64" {
		return badRequest(fmt.Sprintf("encoding %q: want utf8 or base64", encoding))
	}
	data, _, err := s.readRegular(p)
	if err != nil {
		return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("read %s: %w", p, err))
	}
	content := string(data)
	if encoding == "base64" {
		content = base64.StdEncoding.EncodeToString(data)
	}
	writeJSON(w, http.StatusOK, map[string]any{"content": content, "size": len(data)})
	return nil
}

func (s *Server) getBlob(w http.ResponseWriter, r *http.Request) error {
	hash := strings.ToLower(r.PathValue("hash"))
	if !isSHA256Hex(hash) {
		return badRequest("blob: want 64 hex digits of SHA-256")
	}
	data, err := s.blob(r.Context(), hash)
	if err != nil {
		return fsFailure(wsapi.CodeReadFailed, err)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data) // The client went away; nothing left to tell it.
	return nil
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// postTouch rewrites each file with its own bytes (new inode and mtime),
// so file watchers fire. Every path must name an existing regular file
// before any is touched.
func (s *Server) postTouch(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Paths []*string `json:"paths"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	paths := make([]string, len(body.Paths))
	for i, raw := range body.Paths {
		if raw == nil {
			return badRequest(fmt.Sprintf("paths[%d]: must be a string", i))
		}
		p, err := normalize(*raw)
		if err != nil {
			return err
		}
		paths[i] = p
	}
	for _, p := range paths {
		f, _, err := s.openRegular(p)
		if err != nil {
			return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("touch %s: %w", p, err))
		}
		_ = f.Close()
	}
	for _, p := range paths {
		data, fi, err := s.readRegular(p)
		if err != nil {
			return fsFailure(wsapi.CodeReadFailed, fmt.Errorf("touch %s: %w", p, err))
		}
		if err := s.touch(p, data, fi); err != nil {
			return fsFailure(wsapi.CodeWriteFailed, fmt.Errorf("touch %s: %w", p, err))
		}
	}
	writeJSON(w, http.StatusOK, map[string]int{"touched": len(paths)})
	return nil
}

// decodeBody reads one JSON object of at most MaxBodyBytes into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); !errors.Is(extra, io.EOF) {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return &apiError{status: http.StatusRequestEntityTooLarge, code: wsapi.CodeTooLarge,
			msg: fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)}
	case err != nil:
		return badRequest("body: " + err.Error())
	}
	return nil
}
