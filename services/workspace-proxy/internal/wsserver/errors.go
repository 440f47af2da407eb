package wsserver

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"syscall"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

// The error codes in the "error" field of a failure body are wsapi's
// (wsapi.CodeInvalidPath, ...).

var (
	// errSymlink marks a path whose directory part crosses a symbolic link.
	errSymlink = errors.New("path crosses a symbolic link")
	// errNotRegular marks a path that names something other than a regular
	// file (directory, symbolic link, device, ...), or one that changed
	// while it was opened.
	errNotRegular = errors.New("not a regular file")
)

// apiError is a failure with the status and code the client sees.
type apiError struct {
	status int
	code   string
	msg    string
	cause  error
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }
func (e *apiError) Unwrap() error { return e.cause }

func badPath(msg string) error { return &apiError{status: 400, code: wsapi.CodeInvalidPath, msg: msg} }
func badRequest(msg string) error {
	return &apiError{status: 400, code: wsapi.CodeInvalidRequest, msg: msg}
}
func notFound(msg string) error {
	return &apiError{status: 404, code: wsapi.CodeFileNotFound, msg: msg}
}

// fsFailure classifies a filesystem error from operation code on a path:
// absent or not-a-file → 404, a name the filesystem refuses as too long →
// 400 invalid_path, a symlink in the way → 500 unsafe_path, anything else
// → 500 with code.
func fsFailure(code string, err error) error {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return err // Already classified.
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, errNotRegular):
		return &apiError{status: 404, code: wsapi.CodeFileNotFound, msg: err.Error(), cause: err}
	case errors.Is(err, syscall.ENAMETOOLONG):
		return &apiError{status: 400, code: wsapi.CodeInvalidPath, msg: err.Error(), cause: err}
	case errors.Is(err, errSymlink):
		return &apiError{status: 500, code: wsapi.CodeUnsafePath, msg: err.Error(), cause: err}
	default:
		return &apiError{status: 500, code: code, msg: err.Error(), cause: err}
	}
}

// walkFailure is a tree or snapshot that could not complete: always 500
// (a missing file is not the client's problem here).
func walkFailure(err error) error {
	return &apiError{status: 500, code: wsapi.CodeWalkFailed, msg: err.Error(), cause: err}
}

// writeError answers err as {"error","message"} and logs 5xx causes once.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: 500, code: wsapi.CodeInternal, msg: err.Error(), cause: err}
	}
	if ae.status >= 500 && !errors.Is(err, context.Canceled) { // Not for a client that left.
		s.log.Error("workspace request failed", "method", r.Method, "path", r.URL.Path, "code", ae.code, "err", err)
	}
	writeJSON(w, ae.status, map[string]string{"error": ae.code, "message": ae.msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // The client went away; nothing left to tell it.
}
