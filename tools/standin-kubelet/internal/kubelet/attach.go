package kubelet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/proc"
)

// Attach stream timeouts, as a kubelet's defaults.
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

func (k *Kubelet) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/attach/{namespace}/{pod}/{container}", k.serveAttach)
	mux.HandleFunc("/attach/{namespace}/{pod}/{uid}/{container}", k.serveAttach)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	return mux
}

// serveAttach serves pods/attach, which the API server proxies here (SPDY,
// or WebSocket from a direct client).
func (k *Kubelet) serveAttach(w http.ResponseWriter, req *http.Request) {
	key := req.PathValue("namespace") + "/" + req.PathValue("pod")
	uid, container := req.PathValue("uid"), req.PathValue("container")
	opts, err := remotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if k.entryByName(key, types.UID(uid)) == nil {
		http.Error(w, fmt.Sprintf("pod %s not found on this node", key), http.StatusNotFound)
		return
	}
	k.log.Debug("attach", "pod", key, "container", container, "tty", opts.TTY, "stdin", opts.Stdin)
	remotecommand.ServeAttach(w, req, attacher{k}, key, uid, container, opts,
		streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

// attacher connects cri-streaming's attach to the pod's sandbox.
type attacher struct{ k *Kubelet }

func (a attacher) AttachContainer(ctx context.Context, name, uid, container string, in io.Reader, out, errw io.WriteCloser, _ bool, resize <-chan remotecommand.TerminalSize) error {
	e := a.k.entryByName(name, types.UID(uid))
	if e == nil {
		return fmt.Errorf("pod %s not found on this node", name)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sizes chan proc.Size
	done := make(chan struct{})
	if resize != nil {
		sizes = make(chan proc.Size)
		go func() {
			defer close(done)
			defer close(sizes)
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					select {
					case sizes <- proc.Size(sz):
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	} else {
		close(done)
	}
	err := e.sb.Attach(ctx, container, in, writer(out), writer(errw), sizes)
	cancel()
	<-done
	return err
}

// writer turns a nil WriteCloser into a nil Writer (not a non-nil
// interface holding nil).
func writer(w io.WriteCloser) io.Writer {
	if w == nil {
		return nil
	}
	return w
}
