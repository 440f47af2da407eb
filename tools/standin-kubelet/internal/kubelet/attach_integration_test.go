package kubelet

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

func (e *env) attachURL(pod, container string, tty bool) *rest.Request {
	return e.client.CoreV1().RESTClient().Get().Namespace(testNS).Resource("pods").Name(pod).SubResource("attach").
		VersionedParams(&v1.PodAttachOptions{Container: container, Stdin: true, Stdout: true, Stderr: !tty, TTY: tty}, scheme.ParameterCodec)
}

// syncBuffer is written by the executor and polled by the test.
type syncBuffer = testutil.SyncBuffer

// attach opens a WebSocket attach (the client the runner uses) and returns
// its stdin and a channel with the stream's result.
func (e *env) attach(ctx context.Context, t *testing.T, pod string, tty bool, stdout, stderr io.Writer, sizes remotecommand.TerminalSizeQueue) (io.WriteCloser, <-chan error) {
	t.Helper()
	exec, err := remotecommand.NewWebSocketExecutor(e.rc, "GET", e.attachURL(pod, "main", tty).URL().String())
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	res := make(chan error, 1)
	opts := remotecommand.StreamOptions{Stdin: inR, Stdout: stdout, Tty: tty, TerminalSizeQueue: sizes}
	if !tty {
		opts.Stderr = stderr
	}
	go func() {
		res <- exec.StreamWithContext(ctx, opts)
		_ = inR.Close()
	}()
	return inW, res
}

// sizeQueue hands the executor terminal sizes until ctx ends.
type sizeQueue struct {
	ctx   context.Context
	sizes chan remotecommand.TerminalSize
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case sz := <-q.sizes:
		return &sz
	case <-q.ctx.Done():
		return nil
	}
}

func (e *env) testTTYAttach(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("tty", `while read l; do if [ -t 0 ] && [ -t 1 ]; then echo "tty:$l"; else echo "notty:$l"; fi; stty size; done`)
	c := &pod.Spec.Containers[0]
	c.TTY, c.Stdin = true, true
	e.create(ctx, pod)
	running, _ := e.watchPod(ctx, t, "tty", 30*time.Second, phaseIs(v1.PodRunning, v1.PodFailed))
	if running.Status.Phase != v1.PodRunning || !running.Status.ContainerStatuses[0].Ready {
		t.Fatalf("pod = %s %+v, want Running and ready", running.Status.Phase, running.Status.ContainerStatuses)
	}

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out syncBuffer
	queue := sizeQueue{ctx: actx, sizes: make(chan remotecommand.TerminalSize, 1)}
	queue.sizes <- remotecommand.TerminalSize{Width: 100, Height: 40}
	begin := time.Now()
	stdin, res := e.attach(actx, t, "tty", true, &out, nil, queue)
	input := make(chan struct{}, 1)
	var writer sync.WaitGroup
	defer writer.Wait()
	writer.Go(func() {
		for range input {
			if _, err := stdin.Write([]byte("ping\n")); err != nil {
				return
			}
		}
	})
	defer close(input)
	input <- struct{}{}
	firstEcho := time.Duration(0)
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// The resize and the input travel on different streams: repeat the
	// input until the size was applied too.
	for n := 0; !strings.Contains(out.String(), "40 100"); n++ {
		if firstEcho == 0 && strings.Contains(out.String(), "tty:ping") {
			firstEcho = time.Since(begin)
		}
		select {
		case err := <-res:
			t.Fatalf("attach ended early: %v; output %q", err, out.String())
		case <-deadline:
			t.Fatalf("no echo and size through attach; output %q", out.String())
		case <-tick.C:
			if n%10 == 9 {
				select {
				case input <- struct{}{}:
				default:
				}
			}
		}
	}
	if firstEcho == 0 {
		firstEcho = time.Since(begin)
	}
	t.Logf("attach round trip (connect + ping → tty:ping) in %v", firstEcho.Round(time.Millisecond))
	cancel()
	select {
	case err := <-res:
		t.Logf("attach ended after cancel: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("attach did not end after its context was cancelled")
	}
	_ = stdin.Close()
	e.deleteNow(ctx, t, "tty")
}

func (e *env) testStreamsAttach(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	pod := shellPod("streams", `while read l; do echo "out:$l"; echo "err:$l" >&2; done; echo bye`)
	pod.Spec.Containers[0].Stdin = true
	pod.Spec.Containers[0].StdinOnce = true
	e.create(ctx, pod)
	e.watchPod(ctx, t, "streams", 30*time.Second, phaseIs(v1.PodRunning))

	var out, errb syncBuffer
	stdin, res := e.attach(ctx, t, "streams", false, &out, &errb, nil)
	if _, err := stdin.Write([]byte("a\n")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "both streams", 20*time.Second, func() bool {
		return strings.Contains(out.String(), "out:a") && strings.Contains(errb.String(), "err:a")
	})
	if strings.Contains(out.String(), "err:") || strings.Contains(errb.String(), "out:") {
		t.Errorf("streams mixed: stdout %q, stderr %q", out.String(), errb.String())
	}
	// stdinOnce: the end of this session's input closes the program's stdin.
	_ = stdin.Close()
	select {
	case err := <-res:
		if err != nil {
			t.Errorf("attach result = %v, want nil when the container exits", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("attach did not end when the container exited")
	}
	done, _ := e.watchPod(ctx, t, "streams", 30*time.Second, phaseIs(v1.PodSucceeded, v1.PodFailed))
	if done.Status.Phase != v1.PodSucceeded {
		t.Errorf("phase = %s, want Succeeded", done.Status.Phase)
	}
	if !strings.Contains(out.String(), "bye") {
		t.Errorf("stdout = %q, want the output up to the exit", out.String())
	}
	e.deleteNow(ctx, t, "streams")
}
