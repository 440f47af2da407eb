package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// WatchWorkload is a running watch session: the shape of the Kubernetes
// watch pod (contract 11.4) as process groups. <session>/workspace/ is the
// shared workspace, served by one workspace-server process; each app runs
// one kernel process with --watch --inspect, restarted when it dies on its
// own (contract 19 item 16); an optional agent runs beside them in the
// workspace. It implements backend.WatchWorkload.
//
// The workload ends only through Stop or Close — Exit then reports Stopped
// — or when the workspace server dies on its own: everything else is
// stopped and Exit's Err says "workspace server exited: …". Code is
// always nil.
type WatchWorkload struct {
	lifecycle
	b    *Backend
	dir  sessionDir
	sink backend.Sink
	log  *slog.Logger

	ws      *proc                      // the workspace server
	wsc     kernelwire.WorkspaceClient // talks to it
	wsEnded chan struct{}              // closed once the workspace server's drive returned
	agent   *proc                      // nil when the session has no agent
	apps    []*watchApp

	// members owns the goroutines of the workspace server, of every app
	// and of the agent. Every Go happens before the one Wait.
	members sync.WaitGroup
	failure error // why the workload failed; set by supervise only

	reachCtx    context.Context
	agentSpec   *backend.Agent // the co-resident agent; nil without one
	reachCancel context.CancelFunc

	// Lock order: pidMu, then watchApp.mu. mu is never held with another.
	mu             sync.Mutex
	ports          map[int]bool     // loopback ports in use: declared and picked
	watched        map[appPort]bool // reachability watchers ever started
	watchersClosed bool
	watchers       sync.WaitGroup // reachability watchers; Go only under mu, before watchersClosed

	pidMu sync.Mutex // serializes pid-file writes
}

var _ backend.WatchWorkload = (*WatchWorkload)(nil)

type appPort struct {
	app  string
	port int
}

// Session-scoped names of the processes that are not apps.
const (
	workspaceProcName = "workspace"
	agentProcName     = "agent"
)

// watchPlan is a checked watch spec: what Start will run.
type watchPlan struct {
	apps  []backend.App // entries normalized
	seed  kernelwire.Seed
	agent []string // argv of the agent; nil when none
}

// startWatch launches a watch session, the Kubernetes bring-up (11.5) as
// processes:
//
//  1. the session directory with workspace/ and home/;
//  2. the workspace server, polled until GET /workspace answers, then
//     sink.WorkspaceReady;
//  3. the seed (9.5): the bundle, or spec.Restore's checkpoint streamed
//     in bounded change sets (kernelwire.Seed), the apps' entries and
//     then the workspace marker last — unless spec.KeepWorkspace serves
//     the workspace a lost workload left;
//  4. one kernel per app, each waiting for its entry file;
//  5. the agent, when the spec has one;
//  6. sink.Running with every app's declared ports, then the debug relays
//     and reachability watchers.
func (b *Backend) startWatch(ctx context.Context, spec backend.Spec, sink backend.Sink) (*WatchWorkload, error) {
	plan, err := b.planWatch(spec)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if b.sb != nil && b.sb.err != nil {
		return nil, &backend.StartError{Stage: "create", Message: b.sb.unavailable().Error()}
	}
	w := newWatchWorkload(b, spec.SessionID, sink, plan.apps, spec.Agent)
	if err := b.register(&w.lifecycle); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			w.abort()
		}
	}()

	// A restore seeds on top of a workspace directory a lost workload
	// left here, reusing what it holds.
	kept, err := b.clearLeftover(spec.SessionID, spec.KeepWorkspace, spec.Restore != nil)
	if err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if err := w.createDirs(plan.apps, kept); err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	if err := w.startWorkspace(); err != nil {
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}
	sink.Progress(contract.PhaseBoot, "Starting workspace", false, "")
	if err := w.awaitWorkspace(ctx); err != nil {
		return nil, err
	}
	sink.Progress(contract.PhaseBoot, "Starting workspace", true, "")
	if !spec.KeepWorkspace {
		st, err := w.wsc.Seed(ctx, plan.seed, kernelwire.SeedOptions{Last: entries(plan.apps)})
		if err != nil {
			return nil, &backend.StartError{Stage: "start", Message: "seed workspace: " + err.Error()}
		}
		logSeed(w.log, st)
	}
	// Only a seeded workspace is offered to the editor's writes: one
	// acknowledged while the seed ran could be deleted by it (the seed
	// removes what the checkpoint lacks).
	sink.WorkspaceReady(w.wsc.Base)

	for i, app := range plan.apps {
		a := w.newApp(i, app, spec.Env)
		w.apps = append(w.apps, a)
		if !regularFile(a.entry) {
			continue // its goroutine waits for the entry file
		}
		if a.first, err = w.startAppProc(a); err != nil {
			return nil, &backend.StartError{Stage: "start", Message: err.Error()}
		}
	}
	if plan.agent != nil {
		if err := w.startAgent(plan.agent, spec.Agent.Env); err != nil {
			return nil, &backend.StartError{Stage: "start", Message: err.Error()}
		}
		w.agentSpec = spec.Agent
	}
	if err := w.recordPIDs(); err != nil {
		return nil, &backend.StartError{Stage: "start", Message: err.Error()}
	}

	var ports []contract.PortMapping
	for _, app := range plan.apps {
		ports = append(ports, app.Ports...)
	}
	var agent *contract.Endpoint
	if spec.Agent != nil {
		agent = &contract.Endpoint{Host: "", Port: spec.Agent.Port, Protocol: "tcp"}
	}
	sink.Running(hostless(ports), agent)
	w.launch()
	started = true
	w.log.Info("watch session started", "apps", len(plan.apps), "agent", plan.agent != nil, "workspace", w.wsc.Base)
	return w, nil
}

// planWatch checks what this backend can run of a watch spec.
func (b *Backend) planWatch(spec backend.Spec) (watchPlan, error) {
	create := func(format string, args ...any) error {
		return &backend.StartError{Stage: "create", Message: fmt.Sprintf(format, args...)}
	}
	if !contract.ValidSessionID(spec.SessionID) {
		return watchPlan{}, create("invalid session id %q", spec.SessionID)
	}
	if b.workspace == nil {
		return watchPlan{}, create("watch sessions need a workspace server, and the local backend has no WorkspaceServerCommand")
	}
	if spec.SelfContained {
		return watchPlan{}, create("a watch session cannot run a self-contained image")
	}
	apps := spec.Apps
	if len(apps) == 0 {
		apps = []backend.App{{Name: contract.DefaultApp, Entry: spec.Bundle.EntryRelativePath, IO: contract.IOTTY}}
	}
	plan := watchPlan{apps: make([]backend.App, 0, len(apps))}
	names := make(map[string]bool, len(apps))
	for _, app := range apps {
		if app.Name == "" || strings.ContainsAny(app.Name, "/\x00") || names[app.Name] {
			return watchPlan{}, create("invalid or duplicate app name %q", app.Name)
		}
		names[app.Name] = true
		entry, err := contract.NormalizePath(app.Entry)
		if err != nil {
			return watchPlan{}, create("app %s: %v", app.Name, err)
		}
		app.Entry = entry
		plan.apps = append(plan.apps, app)
	}
	seed, err := kernelwire.SpecSeed(spec)
	if err != nil {
		return watchPlan{}, create("%v", err)
	}
	plan.seed = seed
	if spec.Agent != nil {
		if plan.agent, err = imageArgv(spec.Agent.Image); err != nil {
			return watchPlan{}, err
		}
	}
	return plan, nil
}

func newWatchWorkload(b *Backend, id string, sink backend.Sink, apps []backend.App, agent *backend.Agent) *WatchWorkload {
	ctx, cancel := context.WithCancel(context.Background())
	w := &WatchWorkload{
		lifecycle:   newLifecycle(id),
		b:           b,
		sink:        sink,
		log:         b.log.With("session", id),
		wsEnded:     make(chan struct{}),
		reachCtx:    ctx,
		reachCancel: cancel,
		ports:       make(map[int]bool),
		watched:     make(map[appPort]bool),
	}
	for _, app := range apps {
		for _, p := range app.Ports {
			w.ports[p.Port] = true
		}
	}
	if agent != nil && agent.Port != 0 {
		w.ports[agent.Port] = true
	}
	return w
}

// createDirs makes the session directory with workspace/ and one HOME per
// process under home/: workspace, agent and app-<name> (the per-container
// scratch of 11.4). A kept workspace (recovery) becomes workspace/.
func (w *WatchWorkload) createDirs(apps []backend.App, kept string) error {
	var err error
	if w.dir, err = createSessionDir(w.b.root, w.id, workspaceDirName); err != nil {
		return err
	}
	if err := w.dir.stampDriver(w.b.opts.Owner); err != nil {
		return err
	}
	if kept != "" {
		if err := os.Remove(w.dir.workspace()); err != nil {
			return fmt.Errorf("create session directory: %w", err)
		}
		if err := os.Rename(kept, w.dir.workspace()); err != nil {
			return fmt.Errorf("restore kept workspace: %w", err)
		}
	}
	homes := []string{workspaceProcName, agentProcName}
	for _, app := range apps {
		homes = append(homes, appHomeName(app.Name))
	}
	for _, h := range homes {
		if err := os.Mkdir(filepath.Join(w.dir.home(), h), 0o755); err != nil {
			return fmt.Errorf("create session directory: %w", err)
		}
	}
	return w.b.sb.chownForSandbox(w.dir.root, w.dir.workspace(), w.dir.home())
}

// box is the sandbox of every process of the session: each in its own,
// sharing the workspace and the homes read-write.
func (w *WatchWorkload) box() sandboxBox {
	return w.b.box(w.b.opts.WatchCeilings, w.dir, w.dir.workspace(), w.dir.home())
}

func appHomeName(app string) string { return "app-" + app }

// startWorkspace starts the workspace server in its own process group with
// exactly workspaceEnv (no session, no operator env) and hands it to its
// member goroutine. Its output goes to the logger.
func (w *WatchWorkload) startWorkspace() error {
	port, err := w.pickPort()
	if err != nil {
		return err
	}
	home := filepath.Join(w.dir.home(), workspaceProcName)
	env := workspaceEnv(w.dir.workspace(), port, home)
	log := w.log.With("process", workspaceProcName)
	p, err := startProc(w.b.workspace, w.dir.root, env, backend.App{Name: workspaceProcName}, false, log, w.box())
	if err != nil {
		return fmt.Errorf("start workspace server: %w", err)
	}
	_ = p.stdinW.Close() // it reads no stdin: EOF, like a container without stdin
	if err := w.b.track(w.id, workspaceProcName, p); err != nil {
		p.kill()
		return err
	}
	w.ws = p
	w.wsc = kernelwire.WorkspaceClient{Base: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), HTTP: w.b.wsHTTP}
	w.members.Go(func() {
		defer close(w.wsEnded)
		p.drive(w.stopCh, w.killCh, w.b.opts.StopGrace, logOutput{log}, nil)
		w.b.untrack(w.id, p)
	})
	return nil
}

// Readiness probes of a workspace server that does not answer yet start
// wsFirstPoll apart and double up to wsReadyPoll: the server usually
// answers within a few milliseconds of its start, and a resume waits for
// it.
const (
	wsFirstPoll = 5 * time.Millisecond
	wsReadyPoll = 100 * time.Millisecond
)

// awaitWorkspace polls GET /workspace until it answers, for at most the
// WorkspaceReady option.
func (w *WatchWorkload) awaitWorkspace(ctx context.Context) error {
	ready, cancel := context.WithTimeout(ctx, w.b.opts.WorkspaceReady)
	defer cancel()
	tick := time.NewTimer(wsFirstPoll)
	defer tick.Stop()
	for wait := wsFirstPoll; ; wait = min(2*wait, wsReadyPoll) {
		err := w.wsc.Ping(ready)
		if err == nil {
			return nil
		}
		tick.Reset(wait)
		select {
		case <-ready.Done():
			if ctx.Err() != nil {
				return &backend.StartError{Stage: "start", Message: ctx.Err().Error()}
			}
			w.log.Warn("workspace server never answered", "err", err)
			return &backend.StartError{Stage: "start", Message: "workspace never became ready"}
		case <-w.wsEnded:
			return &backend.StartError{Stage: "start", Message: "workspace never became ready: workspace server " + exitText(w.ws)}
		case <-w.stopCh:
			return &backend.StartError{Stage: "start", Message: "session stopped while starting"}
		case <-w.killCh:
			return &backend.StartError{Stage: "start", Message: "session stopped while starting"}
		case <-tick.C:
		}
	}
}

// startAgent starts the co-resident agent (12.3) in the workspace with
// exactly agentEnv: the operator env, never the session env. Its output
// goes to the logger; it has no channel and no reachability watcher.
func (w *WatchWorkload) startAgent(argv []string, operator map[string]string) error {
	home := filepath.Join(w.dir.home(), agentProcName)
	env, dropped := agentEnv(operator, w.dir.workspace(), home)
	log := w.log.With("process", agentProcName)
	if len(dropped) > 0 {
		log.Warn("agent env entries dropped", "names", dropped)
	}
	p, err := startProc(argv, w.dir.workspace(), env, backend.App{Name: agentProcName}, false, log, w.box())
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	_ = p.stdinW.Close() // no stdin, like the agent container
	if err := w.b.track(w.id, agentProcName, p); err != nil {
		p.kill()
		return err
	}
	w.agent = p
	return nil
}

// launch hands every started process to its member goroutine, starts the
// declared ports' reachability watchers and the supervisor that ends the
// workload.
func (w *WatchWorkload) launch() {
	for _, a := range w.apps {
		first := a.first
		a.first = nil
		w.members.Go(func() { w.runApp(a, first) })
	}
	if w.agent != nil {
		w.members.Go(w.runAgent)
	}
	for _, a := range w.apps {
		w.watchPorts(a.app.Name, a.app.Ports)
	}
	if w.agent != nil && w.agentSpec != nil && w.agentSpec.Port != 0 {
		name, port, tm := w.agentSpec.Name, w.agentSpec.Port, w.b.reachTiming()
		w.mu.Lock()
		if !w.watchersClosed {
			w.watchers.Go(func() { kernelwire.CheckAgentPort(w.reachCtx, "127.0.0.1", port, name, w.sink, tm) })
		}
		w.mu.Unlock()
	}
	w.b.wg.Go(w.supervise)
}

// runAgent owns the agent process. An agent that ends on its own is
// logged, not restarted (a container with restartPolicy Never).
func (w *WatchWorkload) runAgent() {
	p := w.agent
	p.drive(w.stopCh, w.killCh, w.b.opts.StopGrace, logOutput{p.log}, nil)
	w.b.untrack(w.id, p)
	if !p.wasStopped() {
		p.log.Warn("agent exited on its own; it is not restarted", "code", p.code)
		w.logPIDs()
	}
}

// supervise waits for a stop or for the workspace server to die, stops
// everything, waits for every member and watcher and ends the workload.
func (w *WatchWorkload) supervise() {
	var deadline <-chan time.Time
	if ttl := w.b.opts.WatchCeilings.TTL; ttl > 0 {
		t := time.NewTimer(ttl)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case <-w.stopCh:
	case <-w.killCh:
	case <-deadline:
		w.failure = errWatchTimeLimit
		w.log.Warn("watch session reached its time limit; ending it", "ttl", w.b.opts.WatchCeilings.TTL)
		w.requestStop()
	case <-w.wsEnded:
		if !w.ws.wasStopped() {
			w.failure = errors.New("workspace server " + exitText(w.ws))
			w.log.Error("workspace server exited; ending the session", "err", w.failure)
		}
		w.requestStop()
	}
	w.members.Wait()
	w.closeWatchers()
	if w.failure != nil {
		w.exit = backend.Exit{Err: w.failure}
	} else {
		w.exit = backend.Exit{Stopped: true}
	}
	w.end()
}

// abort undoes a failed Start: it kills every process started so far,
// waits for the member goroutines, removes the session directory and ends
// the workload.
func (w *WatchWorkload) abort() {
	w.requestKill()
	for _, a := range w.apps {
		if a.first != nil {
			a.first.kill()
			w.b.untrack(w.id, a.first)
		}
	}
	if w.agent != nil {
		w.agent.kill()
		w.b.untrack(w.id, w.agent)
	}
	w.members.Wait()
	w.closeWatchers()
	w.exit = backend.Exit{Err: errors.New("start failed")}
	w.end()
}

// end removes the session directory, unregisters and closes done.
func (w *WatchWorkload) end() {
	if w.dir.root != "" {
		if err := w.dir.removeIfOurs(w.b.opts.Owner); err != nil {
			w.log.Warn("remove session directory", "err", err)
		}
	}
	w.b.unregister(&w.lifecycle)
	close(w.done)
}

// SetPorts checks app exists: processes publish their ports on the host
// themselves, so there is no routing to change.
func (w *WatchWorkload) SetPorts(_ context.Context, app string, _ []contract.PortMapping) error {
	_, err := w.app(app)
	return err
}

// WatchPorts starts reachability watchers (11.7) for app's tcp ports that
// have never been watched in this session; udp ports are skipped, and so
// is everything once the workload is ending. An unknown app is logged.
func (w *WatchWorkload) WatchPorts(app string, ports []contract.PortMapping) {
	if _, err := w.app(app); err != nil {
		w.log.Warn("watch ports", "app", app, "err", err)
		return
	}
	w.watchPorts(app, ports)
}

// Endpoints are host-less: the ports are the host's own.
func (w *WatchWorkload) Endpoints(ports []contract.PortMapping) []contract.Endpoint {
	return hostless(ports)
}

func hostless(ports []contract.PortMapping) []contract.Endpoint {
	out := make([]contract.Endpoint, 0, len(ports))
	for _, p := range ports {
		out = append(out, contract.Endpoint{Host: "", Port: p.Port, Protocol: p.Protocol})
	}
	return out
}

func (w *WatchWorkload) watchPorts(app string, ports []contract.PortMapping) {
	tm := w.b.reachTiming()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watchersClosed {
		return
	}
	for _, p := range ports {
		k := appPort{app, p.Port}
		if p.Protocol == "udp" || w.watched[k] {
			continue
		}
		w.watched[k] = true
		w.ports[p.Port] = true
		w.watchers.Go(func() { kernelwire.WatchReachability(w.reachCtx, "127.0.0.1", p.Port, app, w.sink, tm) })
	}
}

// closeWatchers stops every reachability watcher and waits for them.
func (w *WatchWorkload) closeWatchers() {
	w.mu.Lock()
	w.watchersClosed = true
	w.mu.Unlock()
	w.reachCancel()
	w.watchers.Wait()
}

// pickPort returns a free loopback port not used by this session yet.
func (w *WatchWorkload) pickPort() (int, error) {
	for range 32 {
		port, err := freeLoopbackPort()
		if err != nil {
			return 0, err
		}
		w.mu.Lock()
		taken := w.ports[port]
		w.ports[port] = true
		w.mu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("pick loopback port: every port offered is in use by the session")
}

// processGroups returns the process group of every running process of
// the session by role: "workspace", "agent" and "app-<name>".
func (w *WatchWorkload) processGroups() map[string]int {
	groups := make(map[string]int)
	if w.ws != nil && !w.ws.hasExited() {
		groups[workspaceProcName] = w.ws.pgid
	}
	for _, a := range w.apps {
		if p := a.current(); p != nil && !p.hasExited() {
			groups[appHomeName(a.app.Name)] = p.pgid
		}
	}
	if w.agent != nil && !w.agent.hasExited() {
		groups[agentProcName] = w.agent.pgid
	}
	return groups
}

// recordPIDs rewrites the pid file with every running process group: the
// workspace server, the app kernels in app order, the agent.
func (w *WatchWorkload) recordPIDs() error {
	w.pidMu.Lock()
	defer w.pidMu.Unlock()
	groups := w.processGroups()
	pgids := make([]int, 0, len(groups))
	for _, role := range w.roles() {
		if id, ok := groups[role]; ok {
			pgids = append(pgids, id)
		}
	}
	return w.dir.writePIDs(pgids)
}

// roles lists the process roles in pid-file order.
func (w *WatchWorkload) roles() []string {
	roles := []string{workspaceProcName}
	for _, a := range w.apps {
		roles = append(roles, appHomeName(a.app.Name))
	}
	return append(roles, agentProcName)
}

// exitText describes how a process that has exited ended.
func exitText(p *proc) string {
	if p.waitErr != nil {
		return "exited: " + p.waitErr.Error()
	}
	if p.code > 128 {
		return fmt.Sprintf("exited: killed by signal %d (exit code %d)", p.code-128, p.code)
	}
	return fmt.Sprintf("exited: exit code %d", p.code)
}

// entries are the apps' entry paths.
func entries(apps []backend.App) []string {
	out := make([]string, len(apps))
	for i, a := range apps {
		out[i] = a.Entry
	}
	return out
}

// logSeed logs what a seed did (its timing breakdown included).
func logSeed(log *slog.Logger, st kernelwire.SeedStats) {
	log.Info("workspace seeded", "files", st.Files, "written", st.Written, "staged", st.Staged, "unchanged", st.Unchanged,
		"fetched", st.Fetched, "fetchedBytes", st.FetchedBytes, "fromWorkspace", st.FromWorkspace,
		"bytes", st.Bytes, "changeSets", st.ChangeSets, "fetch", st.Fetch, "post", st.Post, "took", st.Took)
}

// regularFile reports whether path names a regular file (following links).
func regularFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// logOutput sends a process's output to the logger, one record per line;
// the workspace server and the agent have no app channel.
type logOutput struct{ log *slog.Logger }

func (l logOutput) Output(_ string, tag byte, p []byte) {
	stream := "stdout"
	if tag == contract.TagStderr {
		stream = "stderr"
	}
	for line := range bytes.Lines(p) {
		if line = bytes.TrimRight(line, "\r\n"); len(line) > 0 {
			l.log.Info("process output", "stream", stream, "line", string(line))
		}
	}
}
