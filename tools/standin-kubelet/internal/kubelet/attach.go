package kubelet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	mux.HandleFunc("/containerLogs/{namespace}/{pod}/{container}", k.serveLogs)
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

// serveLogs serves pods/log, which the API server proxies here: the
// container's kept output (proc.LogBytes), the last tailLines lines when
// given. follow, previous, timestamps, sinceSeconds/sinceTime and
// limitBytes are not supported (400).
func (k *Kubelet) serveLogs(w http.ResponseWriter, req *http.Request) {
	key := req.PathValue("namespace") + "/" + req.PathValue("pod")
	q := req.URL.Query()
	for _, unsupported := range []string{"follow", "previous", "timestamps"} {
		if q.Get(unsupported) == "true" {
			http.Error(w, unsupported+" is not supported by the stand-in kubelet", http.StatusBadRequest)
			return
		}
	}
	for _, unsupported := range []string{"sinceSeconds", "sinceTime", "limitBytes"} {
		if q.Has(unsupported) {
			http.Error(w, unsupported+" is not supported by the stand-in kubelet", http.StatusBadRequest)
			return
		}
	}
	e := k.entryByName(key, "")
	if e == nil {
		http.Error(w, fmt.Sprintf("pod %s not found on this node", key), http.StatusNotFound)
		return
	}
	out, err := e.sb.Log(req.PathValue("container"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if v := q.Get("tailLines"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, "tailLines must be a non-negative integer", http.StatusBadRequest)
			return
		}
		out = tailLines(out, n)
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(out)
}

// tailLines is the last n lines of b (a final line without a newline
// counts).
func tailLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}
