// Package kubelet is the stand-in kubelet's API-server side: it registers
// the Node, binds unscheduled pods to it, runs every pod bound to it in a
// sandbox, writes pod status, finishes deletions and serves attach.
package kubelet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podip"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/sandbox"
)

// HostIP is the node's only address; pods get their own loopback IPs.
const HostIP = "127.0.0.1"

// Config configures a Kubelet.
type Config struct {
	Client   kubernetes.Interface
	NodeName string
	// Listen is the HTTPS address for attach, on 127.0.0.1; its port is
	// published as the node's kubelet endpoint. Port 0 picks one.
	Listen string
	// PodIPBase is A of the pods' 127.A.x.y addresses.
	PodIPBase byte
	Images    imagemap.Map
	// Root holds one directory per pod.
	Root string
	// Volumes is how containers see volumes; empty probes for mount
	// namespaces and falls back to env.
	Volumes sandbox.VolumeMode
	// Helper is the mount helper binary; empty means this executable.
	Helper string
	Log    *slog.Logger
	// Heartbeat is how often the Node status and Lease are renewed.
	Heartbeat time.Duration
}

// Validate reports a missing or bad field.
func (c *Config) Validate() error {
	switch {
	case c.Client == nil:
		return errors.New("kubelet config: no client")
	case c.NodeName == "":
		return errors.New("kubelet config: no node name")
	case c.Root == "":
		return errors.New("kubelet config: no root directory")
	case c.Volumes != "" && c.Volumes != sandbox.VolumesMount && c.Volumes != sandbox.VolumesEnv:
		return fmt.Errorf("kubelet config: volume mode %q", c.Volumes)
	}
	return nil
}

// Kubelet is a running stand-in kubelet.
type Kubelet struct {
	cfg    Config
	log    *slog.Logger
	client kubernetes.Interface
	ips    *podip.Pool
	ln     net.Listener
	tls    *tls.Config
	port   int

	queue            workqueue.TypedRateLimitingInterface[string] // pods bound here
	bindQueue        workqueue.TypedRateLimitingInterface[string] // unscheduled pods
	podStore         cache.Indexer
	unscheduledStore cache.Indexer

	mu   sync.Mutex
	pods map[types.UID]*entry // admitted pods

	sandboxes     sync.WaitGroup // one Run per admitted pod
	podsDir       string
	applyIdentity bool
	ready         chan struct{}
}

// entry is one admitted pod.
type entry struct {
	key string // namespace/name
	sb  *sandbox.Sandbox
	ip  netip.Addr // zero for hostNetwork pods
	dir string
}

// New validates cfg, picks the volume mode and binds the attach listener.
func New(cfg Config) (*Kubelet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Listen == "" {
		cfg.Listen = HostIP + ":0"
	}
	if cfg.Helper == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		cfg.Helper = self
	}
	// Identities need root: set*id, chown to an fsGroup.
	applyIdentity := os.Geteuid() == 0
	if !applyIdentity {
		cfg.Log.Warn("not running as root: runAsUser, runAsGroup, fsGroup, supplementalGroups and runAsNonRoot "+
			"are not applied, every container runs as the kubelet's user", "uid", os.Geteuid())
	}
	// Containers running as another user reach the root's directories
	// (pods, staged programs): 0755 whatever the umask.
	if err := mkdirMode(cfg.Root); err != nil {
		return nil, fmt.Errorf("create root directory: %w", err)
	}
	podsDir := filepath.Join(cfg.Root, "pods")
	// Processes of an earlier run died with it (parent-death signal).
	if err := os.RemoveAll(podsDir); err != nil {
		return nil, fmt.Errorf("clean pod directories: %w", err)
	}
	if err := mkdirMode(podsDir); err != nil {
		return nil, fmt.Errorf("create pod directories: %w", err)
	}
	if applyIdentity {
		images, err := cfg.Images.Stage(filepath.Join(cfg.Root, "images"))
		if err != nil {
			return nil, err
		}
		cfg.Images = images
	}
	if cfg.Volumes == "" {
		cfg.Volumes = sandbox.VolumesMount
		if err := mountns.Probe(cfg.Helper, cfg.Root); err != nil {
			cfg.Log.Warn("mount namespaces unavailable, volumes are passed as TELO_VOLUME_* env", "err", err)
			cfg.Volumes = sandbox.VolumesEnv
		}
	}
	if applyIdentity && cfg.Volumes == sandbox.VolumesEnv {
		if dir := unsearchable(cfg.Root); dir != "" {
			cfg.Log.Warn("volume mode env: containers that run as another user than root cannot reach the pod "+
				"directories, volumes and programs under --root, a directory above it is not searchable by others",
				"dir", dir)
		}
	}
	tlsCfg, err := selfSignedTLS(cfg.NodeName)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	_, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return &Kubelet{
		cfg:     cfg,
		log:     cfg.Log,
		client:  cfg.Client,
		ips:     podip.New(cfg.PodIPBase),
		ln:      ln,
		tls:     tlsCfg,
		port:    port,
		pods:    map[types.UID]*entry{},
		podsDir: podsDir,
		ready:   make(chan struct{}),

		applyIdentity: applyIdentity,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods"}),
		bindQueue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "bind"}),
	}, nil
}

// mkdirMode creates dir (and its parents) and makes it 0755 whatever the
// umask.
func mkdirMode(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// unsearchable returns the first directory on the way to dir that others
// cannot search, or "" when there is none.
func unsearchable(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// Port is the HTTPS port serving attach.
func (k *Kubelet) Port() int { return k.port }

// Ready is closed once Run registered the node and started watching pods.
func (k *Kubelet) Ready() <-chan struct{} { return k.ready }

// VolumeMode is the volume mode in use.
func (k *Kubelet) VolumeMode() sandbox.VolumeMode { return k.cfg.Volumes }

// Run registers the node and runs pods until ctx is done; then it kills
// every pod's processes and returns nil. An error means it could not start.
func (k *Kubelet) Run(ctx context.Context) error {
	defer func() { _ = k.ln.Close() }()
	if err := k.registerNode(ctx); err != nil {
		return err
	}

	srv := &http.Server{
		Handler:   k.routes(),
		TLSConfig: k.tls,
		// HTTP/1.1 only: attach upgrades the connection.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(k.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.ServeTLS(k.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			k.log.Error("serve attach", "err", err)
		}
	})
	wg.Go(func() { k.heartbeat(ctx) })

	informers, err := k.startInformers(ctx)
	if err != nil {
		k.queue.ShutDown()
		_ = srv.Close()
		wg.Wait()
		return err
	}
	k.log.Info("stand-in kubelet ready", "node", k.cfg.NodeName, "port", k.port, "volumes", k.cfg.Volumes)
	close(k.ready)

	var workers sync.WaitGroup
	for range 4 {
		workers.Go(func() { k.work(ctx) })
	}
	<-ctx.Done()
	k.log.Info("stopping: killing every pod")
	k.queue.ShutDown()
	informers.wait()
	workers.Wait()
	k.sandboxes.Wait() // each sandbox saw ctx end and killed its processes
	_ = srv.Close()
	wg.Wait()
	return nil
}

func (k *Kubelet) work(ctx context.Context) {
	for {
		key, quit := k.queue.Get()
		if quit {
			return
		}
		err := k.syncPod(ctx, key)
		switch {
		case err == nil:
			k.queue.Forget(key)
		case ctx.Err() != nil:
		default:
			k.log.Debug("sync pod, will retry", "pod", key, "err", err)
			k.queue.AddRateLimited(key)
		}
		k.queue.Done(key)
	}
}
