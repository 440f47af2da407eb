package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// wsPoll is the longest workspace readiness poll interval (11.5 step 4);
// polls start at wsFirstPoll and double: the server usually answers within
// tens of milliseconds of the pod running.
const (
	wsPoll      = 500 * time.Millisecond
	wsFirstPoll = 20 * time.Millisecond
)

// WatchWorkload is a watch session: one pod with the workspace server,
// one kernel container per app and an optional agent (contract 11.4).
// It implements backend.WatchWorkload. The pod restarts dead app
// containers (restartPolicy Always); each termination is reported once
// through RunEnded. The workload ends through Stop (Stopped), the pod
// reaching Failed/Succeeded (Err "session pod reached <phase>", e.g. the
// TTL deadline) or the pod vanishing (Err "pod disappeared").
type WatchWorkload struct {
	*core
	podObj *corev1.Pod
	apps   []backend.App // normalized, in container order
	agent  *backend.Agent

	mu      sync.Mutex                        // guards the fields below; never held over I/O
	ports   map[string][]contract.PortMapping // routed ports per app
	watched map[string]bool                   // app/proto/port reachability started
	relays  map[string]context.CancelFunc     // per app: the current relay
	ends    map[string]int32                  // per app: terminations reported

	routeMu sync.Mutex // serializes publish: held over I/O, never with mu
}

var _ backend.WatchWorkload = (*WatchWorkload)(nil)

func (b *Backend) startWatch(ctx context.Context, spec backend.Spec, sink backend.Sink) (*WatchWorkload, error) {
	name := b.namer.WatchPodName(spec.SessionID)
	pod, err := podspec.Watch(b.params, spec, name)
	if err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	seed, err := kernelwire.SpecSeed(spec)
	if err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	sink.Progress(contract.PhaseProvision, "Creating pod", false, "")
	created, err := b.client.CoreV1().Pods(b.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, &backend.StartError{Stage: "create", Message: "failed to create pod: " + err.Error()}
	}
	fail := func(msg string) error {
		if derr := b.deletePod(context.WithoutCancel(ctx), created.Name); derr != nil {
			b.log.Warn("delete pod after failed start", "session", spec.SessionID, "err", derr)
		}
		return &backend.StartError{Stage: "start", Message: msg}
	}
	running, err := b.waitRunning(ctx, created.Name, true, sink)
	if err != nil {
		return nil, fail(err.Error())
	}

	sink.Progress(contract.PhaseBoot, "Starting workspace", false, "")
	wsc := kernelwire.WorkspaceClient{Base: "http://" + net.JoinHostPort(running.Status.PodIP, strconv.Itoa(podspec.WorkspacePort)), HTTP: b.http}
	if err := b.awaitWorkspace(ctx, wsc); err != nil {
		return nil, fail("workspace container did not become ready: " + err.Error())
	}
	sink.Progress(contract.PhaseBoot, "Starting workspace", true, "")
	apps, err := podspec.WatchApps(spec)
	if err != nil {
		return nil, fail(err.Error())
	}
	last := make([]string, 0, len(apps))
	for _, a := range apps {
		last = append(last, a.Entry) // written last: each app container waits for its entry (10.1)
	}
	st, err := wsc.Seed(ctx, seed, kernelwire.SeedOptions{Last: last})
	if err != nil {
		return nil, fail("seed workspace: " + err.Error())
	}
	b.log.Info("workspace seeded", "session", spec.SessionID, "files", st.Files, "written", st.Written, "staged", st.Staged, "unchanged", st.Unchanged,
		"fetched", st.Fetched, "fetchedBytes", st.FetchedBytes, "fromWorkspace", st.FromWorkspace,
		"bytes", st.Bytes, "changeSets", st.ChangeSets, "fetch", st.Fetch, "post", st.Post, "took", st.Took)
	// Only a seeded workspace is offered to the editor's writes: one
	// acknowledged while the seed ran could be deleted by it (the seed
	// removes what the checkpoint lacks).
	sink.WorkspaceReady(wsc.Base)

	w, err := b.newWatchWorkload(spec, running, sink)
	if err != nil {
		return nil, fail(err.Error())
	}
	w.attach(true)
	if err := w.publishAll(ctx); err != nil {
		w.log.Warn("publish routing", "err", err)
		for _, a := range w.apps {
			sink.Output(a.Name, diagnosticTag(a), []byte("\r\n[runner] failed to create ingress: "+err.Error()+"\r\n"))
		}
	}
	for i, a := range w.apps {
		w.startRelay(i, a.Name, time.Time{})
		w.watchReach(a.Name, a.Ports)
	}
	if ag := w.agent; ag != nil && ag.Port != 0 {
		w.wg.Go(func() { kernelwire.CheckAgentPort(w.ctx, w.podIP, ag.Port, ag.Name, w.sink, w.b.opts.Reach) })
	}
	sink.Running(w.endpoints(), w.agentEndpoint())
	b.wg.Go(w.monitor)
	w.log.Info("watch session started", "apps", len(w.apps))
	return w, nil
}

// newWatchWorkload builds the workload state of a running watch pod.
func (b *Backend) newWatchWorkload(spec backend.Spec, pod *corev1.Pod, sink backend.Sink) (*WatchWorkload, error) {
	apps, err := podspec.WatchApps(spec)
	if err != nil {
		return nil, err
	}
	w := &WatchWorkload{
		core: b.newCore(spec.SessionID, pod, sink), podObj: pod, apps: apps, agent: spec.Agent,
		ports: make(map[string][]contract.PortMapping), watched: make(map[string]bool),
		relays: make(map[string]context.CancelFunc), ends: make(map[string]int32),
	}
	for _, a := range apps {
		w.ports[a.Name] = podspec.Dedupe(a.Ports)
		w.atts[a.Name] = newAttachment(a.Name, podspec.AppContainerName(a.Name), a.IO != contract.IOStreams)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if app, ok := w.appOf(cs.Name); ok {
			w.ends[app] = terminations(cs)
		}
	}
	return w, nil
}

func (b *Backend) awaitWorkspace(ctx context.Context, wsc kernelwire.WorkspaceClient) error {
	ctx, cancel := context.WithTimeout(ctx, b.opts.WorkspaceReady)
	defer cancel()
	for wait := wsFirstPoll; ; wait = min(2*wait, wsPoll) {
		err := wsc.Ping(ctx)
		if err == nil {
			return nil
		}
		if !sleep(ctx, wait) {
			return err
		}
	}
}

func (w *WatchWorkload) appOf(container string) (string, bool) {
	for _, a := range w.apps {
		if podspec.AppContainerName(a.Name) == container {
			return a.Name, true
		}
	}
	return "", false
}

// startRelay (re)starts app i's debug relay: a restarted container is a
// new inspection server, so the old relay and its de-dup state go.
func (w *WatchWorkload) startRelay(i int, app string, after time.Time) {
	ctx, cancel := context.WithCancel(w.ctx)
	w.mu.Lock()
	old := w.relays[app]
	w.relays[app] = cancel
	w.mu.Unlock()
	if old != nil {
		old()
	}
	w.relay(ctx, app, podspec.InspectPort(i), kernelwire.RelayOptions{After: after})
}

// terminations counts a container's ends so far.
func terminations(cs corev1.ContainerStatus) int32 {
	n := cs.RestartCount
	if cs.State.Terminated != nil {
		n++
	}
	return n
}

// monitor reports app container terminations once each and maps the
// pod's end to Exit (11.5 step 10).
func (w *WatchWorkload) monitor() {
	var exit backend.Exit
	_ = w.b.observe(context.Background(), w.pod, func(pod *corev1.Pod) bool {
		switch {
		case pod == nil:
			exit = backend.Exit{Err: errors.New("pod disappeared")}
			return true
		case w.stopping.Load() && pod.DeletionTimestamp != nil:
			return false
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			exit = backend.Exit{Err: fmt.Errorf("session pod reached %s", pod.Status.Phase)}
			return true
		}
		w.reportEnds(pod)
		return false
	})
	w.finish(exit)
}

func (w *WatchWorkload) reportEnds(pod *corev1.Pod) {
	for _, cs := range pod.Status.ContainerStatuses {
		app, ok := w.appOf(cs.Name)
		if !ok {
			continue
		}
		n := terminations(cs)
		w.mu.Lock()
		seen := w.ends[app]
		if n > seen {
			w.ends[app] = n
		}
		w.mu.Unlock()
		if n <= seen || w.stopping.Load() {
			continue
		}
		t := cs.State.Terminated
		if t == nil {
			t = cs.LastTerminationState.Terminated
		}
		if t == nil {
			continue
		}
		w.sink.RunEnded(app, contract.IntPtr(int(t.ExitCode)), endReason(t))
		i := slices.IndexFunc(w.apps, func(a backend.App) bool { return a.Name == app })
		w.startRelay(i, app, time.Time{})
	}
}

// routed is every routed port: all apps' ports, then the agent's (tcp).
func (w *WatchWorkload) routedLocked() []contract.PortMapping {
	var all []contract.PortMapping
	for _, a := range w.apps {
		all = append(all, w.ports[a.Name]...)
	}
	if w.agent != nil && w.agent.Port != 0 {
		all = append(all, contract.PortMapping{Port: w.agent.Port, Protocol: "tcp"})
	}
	return all
}

func (w *WatchWorkload) publishAll(ctx context.Context) error {
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	w.mu.Lock()
	ports := w.routedLocked()
	w.mu.Unlock()
	return w.b.publish(ctx, w.id, w.podObj, ports)
}

// endpoints are every app's announced endpoints, in app order.
func (w *WatchWorkload) endpoints() []contract.Endpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ports []contract.PortMapping
	for _, a := range w.apps {
		ports = append(ports, w.ports[a.Name]...)
	}
	return podspec.Endpoints(w.b.params, w.id, ports)
}

// agentEndpoint is the co-resident agent's routed endpoint (nil without
// an agent).
func (w *WatchWorkload) agentEndpoint() *contract.Endpoint {
	if w.agent == nil {
		return nil
	}
	eps := podspec.Endpoints(w.b.params, w.id, []contract.PortMapping{{Port: w.agent.Port, Protocol: "tcp"}})
	return &eps[0]
}

// Endpoints announces ports the way this session routes them: tcp ports
// with their ingress host and URL when a base domain is configured.
func (w *WatchWorkload) Endpoints(ports []contract.PortMapping) []contract.Endpoint {
	return podspec.Endpoints(w.b.params, w.id, ports)
}

// SetPorts replaces app's routed port set and re-publishes the Service
// and Ingress for the whole session (contract 11.8 live patching). On a
// publish failure the previous set is restored and routing is left as it
// was (19 item 19); the error is returned. Port conflicts with other apps
// or the agent are the caller's to reject first.
func (w *WatchWorkload) SetPorts(ctx context.Context, app string, ports []contract.PortMapping) error {
	if _, ok := w.atts[app]; !ok {
		return fmt.Errorf("session %s has no app %q", w.id, app)
	}
	ports = podspec.Dedupe(ports)
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	w.mu.Lock()
	old := w.ports[app]
	w.ports[app] = ports
	routed := w.routedLocked()
	w.mu.Unlock()
	if err := w.b.publish(ctx, w.id, w.podObj, routed); err != nil {
		w.mu.Lock()
		w.ports[app] = old
		routed = w.routedLocked()
		w.mu.Unlock()
		if rerr := w.b.publish(context.WithoutCancel(ctx), w.id, w.podObj, routed); rerr != nil {
			w.log.Warn("restore routing", "app", app, "err", rerr)
		}
		return err
	}
	return nil
}

// WatchPorts starts reachability watchers for app's tcp ports never
// watched in this pod (udp and already-watched ports are skipped).
func (w *WatchWorkload) WatchPorts(app string, ports []contract.PortMapping) {
	w.watchReach(app, ports)
}

func (w *WatchWorkload) watchReach(app string, ports []contract.PortMapping) {
	var fresh []contract.PortMapping
	w.mu.Lock()
	for _, p := range podspec.Dedupe(ports) {
		k := app + "/" + p.Key()
		if p.Protocol == "udp" || w.watched[k] {
			continue
		}
		w.watched[k] = true
		fresh = append(fresh, p)
	}
	w.mu.Unlock()
	if w.ctx.Err() != nil {
		return
	}
	w.reach(app, fresh)
}
