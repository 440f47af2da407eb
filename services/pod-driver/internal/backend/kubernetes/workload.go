package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// core is what run and watch workloads share: the pod, its attachments,
// the goroutines hanging off it and the end.
type core struct {
	b     *Backend
	id    string
	pod   string // pod name
	podIP string
	sink  backend.Sink
	log   *slog.Logger

	ctx    context.Context // ends when the workload finishes
	cancel context.CancelFunc
	wg     sync.WaitGroup // attach, relays, reachability; Go only before finish
	atts   map[string]*attachment

	stopping atomic.Bool
	done     chan struct{}
	exit     backend.Exit
}

func (b *Backend) newCore(id string, pod *corev1.Pod, sink backend.Sink) *core {
	ctx, cancel := context.WithCancel(context.Background())
	return &core{
		b: b, id: id, pod: pod.Name, podIP: pod.Status.PodIP, sink: sink,
		log: b.log.With("session", id, "pod", pod.Name),
		ctx: ctx, cancel: cancel, atts: make(map[string]*attachment),
		done: make(chan struct{}),
	}
}

// Stdin queues p for app's container stdin (dropped when the queue is
// full: an error says so). An unknown app is an error.
func (w *core) Stdin(app string, p []byte) error {
	a, ok := w.atts[app]
	if !ok {
		return fmt.Errorf("session %s has no app %q", w.id, app)
	}
	return a.write(p)
}

// Resize sets app's terminal size (tty apps; a no-op for streams).
func (w *core) Resize(app string, cols, rows int) error {
	a, ok := w.atts[app]
	if !ok {
		return fmt.Errorf("session %s has no app %q", w.id, app)
	}
	if !a.tty {
		return nil
	}
	if cols < 1 || cols > 0xffff || rows < 1 || rows > 0xffff {
		return fmt.Errorf("resize app %s: size %dx%d out of range", app, cols, rows)
	}
	a.setSize(cols, rows)
	return nil
}

// Stop deletes the pod (grace 0) and waits until the workload has ended
// (Exit then reports Stopped) or ctx ends. Idempotent; after a natural
// end it returns at once.
func (w *core) Stop(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	default:
	}
	w.stopping.Store(true)
	if err := w.b.deletePod(ctx, w.pod); err != nil {
		return err
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop session %s: %w", w.id, ctx.Err())
	}
}

// Done is closed once the workload ended and every Output call returned.
func (w *core) Done() <-chan struct{} { return w.done }

// Exit is how the workload ended; valid after Done.
func (w *core) Exit() backend.Exit { return w.exit }

// attach starts the attach goroutine of every attachment; reattach for
// containers that restart (watch pods).
func (w *core) attach(reattach bool) {
	for _, a := range w.atts {
		w.wg.Go(func() { w.b.keepAttached(w.ctx, w.pod, a, w.sink, w.log, reattach) })
	}
}

// relay starts a debug relay from the pod's port until ctx ends.
func (w *core) relay(ctx context.Context, app string, port int, opts kernelwire.RelayOptions) {
	url := "http://" + net.JoinHostPort(w.podIP, strconv.Itoa(port)) + "/events"
	opts.Client, opts.Retry, opts.Logger = w.b.http, w.b.opts.RelayRetry, w.log
	w.wg.Go(func() { kernelwire.Relay(ctx, url, app, w.sink, opts) })
}

// reach starts reachability watchers for the tcp ports (11.7).
func (w *core) reach(app string, ports []contract.PortMapping) {
	for _, p := range ports {
		if p.Protocol == "udp" {
			continue
		}
		w.wg.Go(func() { kernelwire.WatchReachability(w.ctx, w.podIP, p.Port, app, w.sink, w.b.opts.Reach) })
	}
}

// finish ends the workload: stops every goroutine, waits, deletes a pod
// that ended on its own, records exit. Called once, by the monitor
// goroutine. The contract (11.13) leaves a Succeeded or Failed pod behind
// until the next boot's reap; its output and status are already recorded,
// and through owner references it keeps its Service, Ingress and bundle
// ConfigMap alive, so it goes now.
func (w *core) finish(exit backend.Exit) {
	w.cancel()
	w.wg.Wait()
	if w.stopping.Load() {
		exit = backend.Exit{Stopped: true}
	} else if err := w.b.deletePod(context.Background(), w.pod); err != nil {
		w.log.Warn("delete ended pod", "pod", w.pod, "err", err)
	}
	w.exit = exit
	w.log.Info("session workload ended", "stopped", exit.Stopped, "err", exit.Err)
	close(w.done)
}

// waitRunning follows a new pod until it runs with an IP (11.5 step 3,
// 11.13), reporting provision progress. A run pod that already succeeded
// counts as having run. Any other end is an error message for the start
// failure.
func (b *Backend) waitRunning(ctx context.Context, name string, watchPod bool, sink backend.Sink) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.startDeadline(watchPod))
	defer cancel()
	var got *corev1.Pod
	var fail error
	last := ""
	err := b.observe(ctx, name, func(pod *corev1.Pod) bool {
		switch {
		case pod == nil:
			fail = fmt.Errorf("pod disappeared before reaching Running")
			return true
		case pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "":
			got = pod
			return true
		case pod.Status.Phase == corev1.PodSucceeded && !watchPod:
			got = pod
			return true
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			if watchPod {
				fail = fmt.Errorf("pod reached %s before serving", pod.Status.Phase)
			} else {
				fail = fmt.Errorf("%s", podFailureMessage(pod))
			}
			return true
		}
		if msg := provisionMessage(pod); msg != last {
			last = msg
			sink.Progress(contract.PhaseProvision, msg, false, "")
		}
		return false
	})
	if fail != nil {
		return nil, fail
	}
	if err != nil {
		return nil, fmt.Errorf("pod did not reach Running within the start deadline")
	}
	sink.Progress(contract.PhaseProvision, "Pod running", true, "")
	return got, nil
}
