// Package wsserver is the in-pod workspace file service (contract 9.2): an
// http.Handler over one directory opened with os.Root, so that no client
// path, symbolic link or concurrent rename can make it read or write
// outside that directory.
//
// Every client path is normalized with contract.NormalizePath first; all
// filesystem work then goes through the *os.Root. On top of that hard
// boundary the server refuses, as policy, any path whose directory part
// crosses a symbolic link even when the link stays inside the root: the
// tree never follows links, so neither do reads, writes or deletes.
//
// Failures answer {"error": code, "message": text}: 400 invalid_path (the
// path does not normalize, or names something the filesystem refuses as
// too long), 400 invalid_request (body or query fails its schema; nothing
// of the request is applied), 404 file_not_found (no regular file there,
// or no listed file with that hash), 409 file_changed (a range read
// during which the file changed), 409 workspace_frozen (a write while
// frozen), 413 payload_too_large (body over 64 MiB), and 500 with unsafe_path (a symbolic link in the way),
// write_failed, delete_failed, read_failed or walk_failed.
package wsserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	// MaxBodyBytes bounds every request body.
	MaxBodyBytes = 64 << 20
	// readConcurrency is how many files a tree or snapshot reads at once.
	readConcurrency = 8
	// shutdownGrace is how long Serve lets in-flight requests finish.
	shutdownGrace = 10 * time.Second
)

// DefaultExclude returns the base names skipped at any depth by the tree,
// the snapshot and blob lookups (contract 9.2).
func DefaultExclude() []string { return []string{"node_modules", ".telo", ".git"} }

// Options configure a Server.
type Options struct {
	// Dir is the workspace root. It must exist and be a directory.
	Dir string
	// Exclude lists base names skipped at any depth. nil means
	// DefaultExclude(); a non-nil empty slice excludes nothing.
	Exclude []string
	// Logger receives failures answered with 5xx. nil discards.
	Logger *slog.Logger
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	if o.Dir == "" {
		return errors.New("workspace dir: required")
	}
	for _, name := range o.Exclude {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("exclude %q: not a plain file name", name)
		}
	}
	return nil
}

// Server serves the workspace API. It is safe for concurrent use.
type Server struct {
	root    *os.Root
	exclude map[string]bool
	log     *slog.Logger
	mux     *http.ServeMux
	hashes  *hashCache
	trees   *nodeCache // Tree nodes of the last walks (GET /workspace/node).
	now     func() time.Time
	// errEscapes is os.Root's (unexported) error for a path that leaves
	// the root, captured at New so that it can be matched with errors.Is.
	errEscapes error

	// writes is held shared by every write (apply, touch) and exclusively
	// to freeze: once POST /workspace/freeze answers, every write that
	// began before it has finished and every later one is refused (409
	// workspace_frozen) until thawed. A suspend freezes the workspace
	// before its final checkpoint, so no write lands after it unseen.
	writes sync.RWMutex
	frozen bool

	// uploads are the staged writes (stage.go).
	uploads uploads
}

// New opens opts.Dir as an os.Root and returns the server. Close releases
// the directory handle.
func New(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Exclude == nil {
		opts.Exclude = DefaultExclude()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	root, err := os.OpenRoot(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", opts.Dir, err)
	}
	s := &Server{
		root:    root,
		exclude: make(map[string]bool, len(opts.Exclude)),
		log:     opts.Logger,
		mux:     http.NewServeMux(),
		hashes:  newHashCache(),
		trees:   newNodeCache(),
		now:     time.Now,
	}
	for _, name := range opts.Exclude {
		s.exclude[name] = true
	}
	var pe *fs.PathError
	if _, err := root.Lstat(".."); errors.As(err, &pe) {
		s.errEscapes = pe.Err
	}
	s.routes()
	return s, nil
}

// Close releases the workspace directory handle. Requests still running
// fail afterwards.
func (s *Server) Close() error { return s.root.Close() }

// ServeHTTP dispatches to the routes of contract 9.2 plus
// GET /workspace/blob/{hash}, GET /workspace/node[/{hash}] (tree nodes),
// POST /workspace/touch, GET /healthz, and the paged routes
// GET /workspace/treepage, GET /workspace/range and
// POST|DELETE /workspace/stage.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve answers on ln until ctx ends, then stops accepting, lets in-flight
// requests finish for up to 10 s, and closes what remains. It takes
// ownership of ln and returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	graceful, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	err := hs.Shutdown(graceful)
	if err != nil {
		err = errors.Join(fmt.Errorf("shutdown: %w", err), hs.Close())
	}
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("serve: %w", serveErr))
	}
	return err
}
