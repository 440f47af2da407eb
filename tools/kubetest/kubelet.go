//go:build linux

package kubetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// kubeletStopGrace lets the stand-in kubelet stop its pods' processes.
const kubeletStopGrace = 15 * time.Second

// KubeletOptions configures StartKubelet.
type KubeletOptions struct {
	// Images maps an image name as pods name it (e.g. "kernel") to the
	// local binary the stand-in kubelet runs for it.
	Images map[string]string
	// Args are extra flags for standin-kubelet.
	Args []string
}

// StartKubelet runs $TELORUNNER_KUBE_BIN/standin-kubelet against the Env
// with the admin kubeconfig, node name KubeletName, pod addresses under
// PodIPBase, a free loopback port and per-pod directories under the Env's
// directory, and blocks until the Node is Ready.
// It fails the test on error and at most one kubelet runs per Env; the
// kubelet is stopped in t.Cleanup, before the control plane.
func (e *Env) StartKubelet(t testing.TB, o KubeletOptions) {
	t.Helper()
	bin := bins(t, "standin-kubelet")["standin-kubelet"]
	e.mu.Lock()
	running := e.kubelet != nil
	e.mu.Unlock()
	if running {
		t.Fatalf("kubetest: StartKubelet called twice")
	}

	ports, err := freePorts(1)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	var images []string
	for _, name := range slices.Sorted(maps.Keys(o.Images)) {
		images = append(images, name+"="+o.Images[name])
	}
	args := []string{
		"--kubeconfig", e.KubeconfigPath(e.Admin),
		"--node-name", e.KubeletName,
		"--pod-ip-base", e.PodIPBase,
		"--image-map", strings.Join(images, ","),
		"--listen", "127.0.0.1:" + strconv.Itoa(ports[0]),
		"--root", filepath.Join(e.dir, "kubelet"),
	}
	p, err := startProc(e.dir, "standin-kubelet", bin, append(args, o.Args...)...)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	e.mu.Lock()
	e.kubelet = p
	e.mu.Unlock()
	t.Cleanup(func() {
		p.stop(kubeletStopGrace)
		if t.Failed() {
			t.Logf("kubetest: --- standin-kubelet log (tail) ---\n%s", p.tail(8192))
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.waitNodeReady(ctx, p); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

// waitNodeReady polls the Node until its Ready condition is True.
func (e *Env) waitNodeReady(ctx context.Context, p *proc) error {
	admin, err := kubernetes.NewForConfig(e.Admin)
	if err != nil {
		return fmt.Errorf("create admin client: %w", err)
	}
	var last string
	err = poll(ctx, func() (bool, error) {
		if done, err := p.exited(); done {
			return false, errors.New(p.failure(err))
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, e.KubeletName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = "node not registered"
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s (%s)", c.Status, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for node %s: %w (last: %s)\n--- standin-kubelet log (tail) ---\n%s", e.KubeletName, err, last, p.tail(4096))
	}
	return nil
}

// claimPodIPBase picks X in 127.X.0.0/16, X in 2..254, that no other Env on
// this machine holds, and holds it with an flock on a file in the temp
// directory until the returned file is closed (or the process dies).
func claimPodIPBase() (string, *os.File, error) {
	const lo, n = 2, 253
	start := os.Getpid() % n
	for i := range n {
		x := lo + (start+i)%n
		path := filepath.Join(os.TempDir(), fmt.Sprintf("telorunner-kubetest-127.%d.lock", x))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return "", nil, fmt.Errorf("claim pod IP range: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return "127." + strconv.Itoa(x), f, nil
		}
		_ = f.Close()
	}
	return "", nil, errors.New("claim pod IP range: all of 127.2-127.254 are held by other environments")
}
