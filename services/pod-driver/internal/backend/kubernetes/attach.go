package kubernetes

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// stdinQueue bounds the input waiting for an attach stream, in writes.
const stdinQueue = 256

// reattachMin and reattachMax time re-attaching after a stream ends while
// the workload lives (a restarted watch container is a new process).
const (
	reattachMin = 250 * time.Millisecond
	reattachMax = 5 * time.Second
)

// attachment is the terminal of one app container: a bounded stdin queue
// and a resize queue that survive re-attaches.
type attachment struct {
	app       string
	container string
	tty       bool
	stdin     chan []byte
	resize    chan remotecommand.TerminalSize
}

func newAttachment(app, container string, tty bool) *attachment {
	return &attachment{
		app: app, container: container, tty: tty,
		stdin:  make(chan []byte, stdinQueue),
		resize: make(chan remotecommand.TerminalSize, 1),
	}
}

// write queues p for the container's stdin; when the queue is full the
// write is dropped and reported.
func (a *attachment) write(p []byte) error {
	select {
	case a.stdin <- append([]byte(nil), p...):
		return nil
	default:
		return fmt.Errorf("stdin of app %s: queue full, input dropped", a.app)
	}
}

// setSize keeps only the newest size.
func (a *attachment) setSize(cols, rows int) {
	sz := remotecommand.TerminalSize{Width: uint16(cols), Height: uint16(rows)}
	for {
		select {
		case a.resize <- sz:
			return
		default:
			select {
			case <-a.resize:
			default:
			}
		}
	}
}

// stdinReader reads the queue until ctx ends (then EOF): never blocks a
// writer, so a failed upgrade cannot wedge Stdin.
type stdinReader struct {
	ctx  context.Context
	a    *attachment
	rest []byte
}

func (r *stdinReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		select {
		case <-r.ctx.Done():
			return 0, io.EOF
		case r.rest = <-r.a.stdin:
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

type sizeQueue struct {
	ctx context.Context
	a   *attachment
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case <-q.ctx.Done():
		return nil
	case sz := <-q.a.resize:
		return &sz
	}
}

// outputWriter hands an attach stream's bytes to the sink.
type outputWriter struct {
	sink backend.Sink
	app  string
	tag  byte
}

func (w outputWriter) Write(p []byte) (int, error) {
	w.sink.Output(w.app, w.tag, p)
	return len(p), nil
}

// attachOnce streams one pods/attach session (WebSocket executor, so a
// Role without get on pods/attach fails here) until it ends or ctx ends.
func (b *Backend) attachOnce(ctx context.Context, pod string, a *attachment, sink backend.Sink) error {
	req := b.client.CoreV1().RESTClient().Post().
		Namespace(b.opts.Namespace).Resource("pods").Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{
			Container: a.container, Stdin: true, Stdout: true, Stderr: !a.tty, TTY: a.tty,
		}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(b.opts.RestConfig, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("attach %s: %w", a.container, err)
	}
	opts := remotecommand.StreamOptions{Stdin: &stdinReader{ctx: ctx, a: a}, Tty: a.tty}
	if a.tty {
		opts.Stdout = outputWriter{sink, a.app, contract.TagTTY}
		opts.TerminalSizeQueue = sizeQueue{ctx, a}
	} else {
		opts.Stdout = outputWriter{sink, a.app, contract.TagStdout}
		opts.Stderr = outputWriter{sink, a.app, contract.TagStderr}
	}
	if err := exec.StreamWithContext(ctx, opts); err != nil {
		return fmt.Errorf("attach %s: %w", a.container, err)
	}
	return nil
}

// keepAttached attaches a to the container. A failure before any stream
// succeeded is pushed on the app's channel once (11.14: non-fatal). With
// reattach (watch pods, whose containers restart) it attaches again after
// every end until ctx ends; without, it returns after the first stream or
// failure.
func (b *Backend) keepAttached(ctx context.Context, pod string, a *attachment, sink backend.Sink, log *slog.Logger, reattach bool) {
	delay := reattachMin
	attached, reported := false, false
	for ctx.Err() == nil {
		began := time.Now()
		err := b.attachOnce(ctx, pod, a, sink)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			attached = true
		case !attached && !reported:
			log.Warn("attach", "app", a.app, "err", err)
			tag := contract.TagTTY
			if !a.tty {
				tag = contract.TagStderr
			}
			sink.Output(a.app, tag, []byte("\r\n[runner] failed to attach: "+err.Error()+"\r\n"))
			reported = true
		default:
			log.Debug("attach", "app", a.app, "err", err)
		}
		if !reattach {
			return
		}
		if time.Since(began) > 10*time.Second {
			delay = reattachMin
		}
		if !sleep(ctx, delay) {
			return
		}
		delay = min(2*delay, reattachMax)
	}
}
