package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// Backend runs session workloads as process groups on this machine. It
// implements backend.Backend. Its methods are safe for concurrent use.
type Backend struct {
	opts      Options
	kernel    []string // KernelCommand with its first word resolved
	workspace []string // WorkspaceServerCommand with its first word resolved; nil when unset
	root      string   // absolute WorkRoot
	sb        *sandbox // nil: Sandbox.Off
	log       *slog.Logger

	transport *http.Transport // debug relays; no keep-alive
	client    *http.Client
	// wsHTTP talks to workspace servers (no keep-alive: nothing idles
	// after a request).
	wsHTTP *http.Client
	// dialRelay dials the kernels' inspection servers. Tests replace it
	// before the first Start to cut relay connections.
	dialRelay func(ctx context.Context, network, addr string) (net.Conn, error)
	// restart times watch-app restarts. Tests replace it before the
	// first Start.
	restart restartPolicy

	wg sync.WaitGroup // every workload goroutine

	mu     sync.Mutex
	closed bool
	live   map[string]*lifecycle // by session id, from Start until done
}

var _ backend.Backend = (*Backend)(nil)

// New validates opts, applies defaults, resolves the kernel and
// workspace-server commands through PATH and creates the work root.
func New(opts Options) (*Backend, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.applyDefaults()
	kernel, err := resolveCommand(opts.KernelCommand)
	if err != nil {
		return nil, fmt.Errorf("local backend: resolve kernel command: %w", err)
	}
	var workspace []string
	if len(opts.WorkspaceServerCommand) > 0 {
		if workspace, err = resolveCommand(opts.WorkspaceServerCommand); err != nil {
			return nil, fmt.Errorf("local backend: resolve workspace server command: %w", err)
		}
	}
	root, err := filepath.Abs(opts.WorkRoot)
	if err != nil {
		return nil, fmt.Errorf("local backend: resolve work root: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("local backend: create work root: %w", err)
	}
	var sb *sandbox
	if !opts.Sandbox.Off {
		sb = newSandbox(opts.Sandbox, root)
		if sb.err != nil {
			opts.Logger.Error("local sandbox unavailable: sessions will be refused (RUNNER_LOCAL_SANDBOX=off runs them without isolation)", "err", sb.err)
		} else {
			opts.Logger.Info("local sandbox ready: user, mount and PID namespaces per workload process", "privileged", sb.privileged, "hidden", sb.hide)
		}
	} else {
		opts.Logger.Warn("local sandbox off (RUNNER_LOCAL_SANDBOX=off): session workloads run as plain host processes with the runner's privileges")
	}
	b := &Backend{
		sb:        sb,
		opts:      opts,
		kernel:    kernel,
		workspace: workspace,
		root:      root,
		log:       opts.Logger,
		live:      make(map[string]*lifecycle),
		restart:   defaultRestart,
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	b.dialRelay = dialer.DialContext
	b.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return b.dialRelay(ctx, network, addr)
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 10 * time.Second,
	}
	b.client = &http.Client{Transport: b.transport}
	b.wsHTTP = &http.Client{Transport: &http.Transport{
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: kernelwire.WorkspaceRequestTimeout,
	}}
	return b, nil
}

// resolveCommand returns argv with its first word resolved through PATH
// and made absolute.
func resolveCommand(argv []string) ([]string, error) {
	argv = slices.Clone(argv)
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	if argv[0], err = filepath.Abs(path); err != nil {
		return nil, err
	}
	return argv, nil
}

// Start launches spec's workload and returns once it is running.
//
// A run session: it creates the session directory, writes the bundle,
// starts one process per app, calls sink.Running with every declared port,
// then starts the reachability watchers and debug relays and returns a
// *Workload.
//
// A watch session (spec.Mode "watch"): see startWatch; it returns a
// *WatchWorkload, which implements backend.WatchWorkload.
//
// Failures are *backend.StartError and leave nothing behind. ctx bounds
// only the start; the workload lives until it exits, Stop or Close.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Workload, error) {
	if spec.Mode == contract.ModeWatch {
		w, err := b.startWatch(ctx, spec, sink)
		if err != nil {
			return nil, err
		}
		return w, nil
	}
	w, err := b.start(ctx, spec, sink)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (b *Backend) start(ctx context.Context, spec backend.Spec, sink backend.Sink) (*Workload, error) {
	apps, err := sessionApps(spec)
	if err != nil {
		return nil, err
	}
	var image []string
	if spec.SelfContained {
		if image, err = imageArgv(spec.Config.Image); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}

	if b.sb != nil && b.sb.err != nil {
		return nil, &backend.StartError{Stage: "create", Message: b.sb.unavailable().Error()}
	}
	w := newWorkload(b, spec.SessionID, sink)
	w.ceil = b.opts.RunCeilings
	if spec.SelfContained {
		w.ceil = b.opts.AppCeilings
	}
	if err := b.register(&w.lifecycle); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			w.abort()
		}
	}()

	if _, err := b.clearLeftover(spec.SessionID, false, false); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if w.dir, err = createSessionDir(b.root, spec.SessionID, appDirName); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if err := w.dir.stampDriver(b.opts.Owner); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if !spec.SelfContained {
		if err := w.dir.writeBundle(spec.Bundle.Files); err != nil {
			return nil, &backend.StartError{Stage: "create", Message: err.Error()}
		}
	}
	if err := b.sb.chownForSandbox(w.dir.root, w.dir.app(), w.dir.home()); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}

	pgids := make([]int, 0, len(apps))
	for _, app := range apps {
		p, err := b.startApp(ctx, spec, app, image, w)
		if err != nil {
			return nil, err
		}
		w.procs = append(w.procs, p)
		pgids = append(pgids, p.pgid)
	}
	if err := w.dir.writePIDs(pgids); err != nil {
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}

	var ports []contract.PortMapping
	for _, app := range apps {
		ports = append(ports, app.Ports...)
	}
	sink.Running(hostless(ports), nil)
	w.launch()
	started = true
	w.log.Info("session workload started", "apps", len(apps), "pgids", pgids)
	return w, nil
}

// startApp starts one app's process.
func (b *Backend) startApp(ctx context.Context, spec backend.Spec, app backend.App, image []string, w *Workload) (*proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}
	argv := image
	inspectPort := 0
	if !spec.SelfContained {
		entry, err := contract.NormalizePath(app.Entry)
		if err != nil {
			return nil, &backend.StartError{Stage: "create", Message: err.Error()}
		}
		if spec.Inspect {
			if inspectPort, err = freeLoopbackPort(); err != nil {
				return nil, &backend.StartError{Stage: "start", Message: err.Error()}
			}
		}
		argv = kernelArgv(b.kernel, w.dir.entry(entry), inspectPort)
	}
	tty := app.IO != contract.IOStreams
	env, dropped := kernelEnv(spec.Env, w.dir.home(), spec.Mode, tty)
	log := w.log.With("app", app.Name)
	if len(dropped) > 0 {
		log.Warn("session env entries dropped", "names", dropped)
	}
	p, err := startProc(argv, w.dir.root, env, app, tty, log, b.box(w.ceil, w.dir, w.dir.app(), w.dir.home()))
	if err != nil {
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}
	if err := b.track(spec.SessionID, app.Name, p); err != nil {
		p.kill()
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}
	p.inspectPort = inspectPort
	return p, nil
}

// sandboxBox is one process's sandbox; the zero value runs it unsandboxed.
type sandboxBox struct {
	sb *sandbox
	ps procSandbox
}

// box is the sandbox of a process of the session in dir: the session
// directory read-only, writable bound read-write, under ceil.
func (b *Backend) box(ceil Ceilings, dir sessionDir, writable ...string) sandboxBox {
	if b.sb == nil {
		return sandboxBox{}
	}
	return sandboxBox{sb: b.sb, ps: procSandbox{ReadOnly: []string{dir.root}, Writable: writable, Ceilings: ceil}}
}

// sessionApps checks a run session and returns its apps: exactly one (the
// default app when the spec lists none).
func sessionApps(spec backend.Spec) ([]backend.App, error) {
	if !contract.ValidSessionID(spec.SessionID) {
		return nil, &backend.StartError{Stage: "create", Message: fmt.Sprintf("invalid session id %q", spec.SessionID)}
	}
	if spec.Mode != contract.ModeRun {
		return nil, &backend.StartError{Stage: "create", Message: fmt.Sprintf("session mode %q is not supported by the local backend", spec.Mode)}
	}
	apps := spec.Apps
	if len(apps) == 0 {
		apps = []backend.App{{Name: contract.DefaultApp, Entry: spec.Bundle.EntryRelativePath, IO: contract.IOTTY}}
	}
	if len(apps) != 1 {
		return nil, &backend.StartError{Stage: "create", Message: fmt.Sprintf("a run session has exactly one app, got %d", len(apps))}
	}
	return apps, nil
}

// Close stops every live workload (SIGTERM, then SIGKILL after StopGrace)
// and waits until all have ended. When ctx ends first the rest are killed
// at once and waited for, and ctx's error is returned: nothing is left
// running either way. Start fails after Close.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	ws := make([]*lifecycle, 0, len(b.live))
	for _, w := range b.live {
		ws = append(ws, w)
	}
	b.mu.Unlock()

	for _, w := range ws {
		w.requestStop()
	}
	err := waitAll(ctx, ws)
	if err != nil {
		for _, w := range ws {
			w.requestKill()
		}
		_ = waitAll(context.Background(), ws) // SIGKILL and bounded drains: this ends
	}
	b.wg.Wait()
	b.sb.close()
	b.transport.CloseIdleConnections()
	return err
}

// waitAll waits until every workload is done or ctx ends.
func waitAll(ctx context.Context, ws []*lifecycle) error {
	for _, w := range ws {
		select {
		case <-w.done:
		case <-ctx.Done():
			return fmt.Errorf("close local backend: %w", ctx.Err())
		}
	}
	return nil
}

// errClosed is the start failure after Close.
var errClosed = errors.New("local backend is closed")

func (b *Backend) register(w *lifecycle) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return &backend.StartError{Stage: "create", Message: errClosed.Error()}
	case b.live[w.id] != nil:
		return &backend.StartError{Stage: "create", Message: fmt.Sprintf("session %s is already running", w.id)}
	}
	b.live[w.id] = w
	return nil
}

func (b *Backend) unregister(w *lifecycle) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live[w.id] == w {
		delete(b.live, w.id)
	}
}
