// Package sandbox runs one pod as host processes: its volumes, its init
// containers in order, then its containers side by side, with restarts,
// an active deadline and graceful termination. It reports what happens as
// podstatus snapshots and never talks to the API server itself.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podstatus"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/proc"
)

// VolumeMode says how containers see their volumes.
type VolumeMode string

const (
	// VolumesMount bind-mounts each volume at its mountPath in a private
	// mount namespace per container (needs root).
	VolumesMount VolumeMode = "mount"
	// VolumesEnv leaves the filesystem alone and tells the program where
	// each volume is through TELO_VOLUME_<NAME>.
	VolumesEnv VolumeMode = "env"
)

// Objects reads the ConfigMaps and Secrets a pod refers to. Errors for
// missing objects must satisfy apierrors.IsNotFound.
type Objects interface {
	ConfigMap(ctx context.Context, namespace, name string) (*v1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*v1.Secret, error)
}

// Timings a real kubelet makes longer; short here because tests wait on them.
var (
	restartBackoff = time.Second
	retryInterval  = time.Second
)

// MaxGrace caps every termination grace period.
const MaxGrace = 30 * time.Second

// Config describes one pod to run.
type Config struct {
	Pod      *v1.Pod // copied by New; the spec is not followed afterwards
	NodeName string
	IP       string // the pod's IP
	HostIP   string
	Dir      string // per-pod directory; must exist
	Images   imagemap.Map
	Volumes  VolumeMode
	Helper   string // mount helper binary (VolumesMount)
	// ApplyIdentity runs every container as the user and groups of its
	// security contexts (runAsUser, runAsGroup, fsGroup,
	// supplementalGroups), refuses runAsNonRoot containers that would run
	// as root, and gives volumes to the fsGroup. It needs root; without it
	// everything runs as the caller.
	ApplyIdentity bool
	Objects       Objects
	Log           *slog.Logger
	// OnChange is called, without locks held, after every change of the
	// snapshot. It must not block.
	OnChange func()
}

// Validate reports a missing or inconsistent field.
func (c *Config) Validate() error {
	switch {
	case c.Pod == nil:
		return errors.New("sandbox config: no pod")
	case c.IP == "" || c.HostIP == "":
		return errors.New("sandbox config: pod IP and host IP are required")
	case c.Dir == "":
		return errors.New("sandbox config: no pod directory")
	case c.Objects == nil:
		return errors.New("sandbox config: no Objects")
	case c.Volumes != VolumesMount && c.Volumes != VolumesEnv:
		return fmt.Errorf("sandbox config: volume mode %q", c.Volumes)
	case c.Volumes == VolumesMount && c.Helper == "":
		return errors.New("sandbox config: mount volume mode needs a helper binary")
	}
	return nil
}

// Sandbox is one running pod. Its methods are safe for concurrent use.
type Sandbox struct {
	cfg Config
	pod *v1.Pod
	log *slog.Logger

	stop     chan struct{} // closed by Stop
	wake     chan struct{} // capacity 1: the kill deadline moved
	exited   chan struct{} // closed when the last container ended
	done     chan struct{} // closed when Run returned
	killerWG sync.WaitGroup

	mu       sync.Mutex
	snap     podstatus.Snapshot
	procs    map[string]*proc.Process // running, by container name
	last     map[string]*proc.Process // the last process of each container, running or not (pods/log)
	stopping bool
	killAt   time.Time // when stopping: SIGKILL what is left at this time
	finished bool      // no container runs any more; no killer may start
}

// New prepares a sandbox; Run starts it.
func New(cfg Config) (*Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	pod := cfg.Pod.DeepCopy()
	s := &Sandbox{
		cfg:    cfg,
		pod:    pod,
		log:    cfg.Log.With("pod", pod.Namespace+"/"+pod.Name),
		stop:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
		exited: make(chan struct{}),
		done:   make(chan struct{}),
		procs:  map[string]*proc.Process{},
		last:   map[string]*proc.Process{},
	}
	s.snap.PodIP, s.snap.HostIP = cfg.IP, cfg.HostIP
	initWait := podstatus.ReasonContainerCreating
	for _, c := range pod.Spec.InitContainers {
		s.snap.Init = append(s.snap.Init, podstatus.Container{Name: c.Name, Reason: podstatus.ReasonPodInitializing})
		initWait = podstatus.ReasonPodInitializing
	}
	for _, c := range pod.Spec.Containers {
		s.snap.Containers = append(s.snap.Containers, podstatus.Container{Name: c.Name, Reason: initWait})
	}
	return s, nil
}

// Pod returns the pod as admitted. The caller must not modify it.
func (s *Sandbox) Pod() *v1.Pod { return s.pod }

// IP returns the pod's IP.
func (s *Sandbox) IP() string { return s.cfg.IP }

// Done is closed when Run returned: no process of the pod is left.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Snapshot returns the pod's current state.
func (s *Sandbox) Snapshot() podstatus.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.snap
	snap.Init = slices.Clone(s.snap.Init)
	snap.Containers = slices.Clone(s.snap.Containers)
	return snap
}

// update changes the snapshot under the lock, then reports the change.
func (s *Sandbox) update(f func(*podstatus.Snapshot)) {
	s.mu.Lock()
	f(&s.snap)
	s.mu.Unlock()
	s.cfg.OnChange()
}

// Run runs the pod until no container will run again: all ended for good,
// the pod failed, or Stop was called and the processes are gone. Cancelling
// ctx stops the pod at once (SIGKILL).
func (s *Sandbox) Run(ctx context.Context) {
	var wg sync.WaitGroup
	runDone := make(chan struct{})
	wg.Go(func() {
		select {
		case <-ctx.Done():
			s.Stop(0)
		case <-runDone:
		}
	})
	s.run(ctx, runDone, &wg)
	close(runDone)
	wg.Wait()

	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
	close(s.exited)
	s.killerWG.Wait()
	// Done is visible both in the snapshot and through Done before the
	// change is reported.
	s.mu.Lock()
	s.snap.Done = true
	s.mu.Unlock()
	close(s.done)
	s.cfg.OnChange()
}

func (s *Sandbox) run(ctx context.Context, runDone <-chan struct{}, wg *sync.WaitGroup) {
	start := time.Now()
	s.update(func(sn *podstatus.Snapshot) { sn.StartTime = start })
	if ads := s.pod.Spec.ActiveDeadlineSeconds; ads != nil {
		wg.Go(func() { s.enforceDeadline(start.Add(time.Duration(*ads)*time.Second), runDone) })
	}

	vols, ok := s.volumes(ctx)
	if !ok {
		return
	}
	for i := range s.pod.Spec.InitContainers {
		if !s.runContainer(ctx, true, i, vols) {
			return
		}
	}
	s.update(func(sn *podstatus.Snapshot) {
		for i := range sn.Containers {
			if sn.Containers[i].State == podstatus.Waiting {
				sn.Containers[i].Reason = podstatus.ReasonContainerCreating
			}
		}
	})
	var containers sync.WaitGroup
	for i := range s.pod.Spec.Containers {
		containers.Go(func() { s.runContainer(ctx, false, i, vols) })
	}
	containers.Wait()
}

// volumes prepares the pod's volumes, retrying until it works or the pod
// is stopped; containers wait in ContainerCreating meanwhile.
func (s *Sandbox) volumes(ctx context.Context) (map[string]volume, bool) {
	for {
		vols, err := s.prepareVolumes(ctx)
		if err == nil {
			return vols, true
		}
		s.log.Warn("prepare volumes", "err", err)
		s.update(func(sn *podstatus.Snapshot) {
			for i := range sn.Containers {
				sn.Containers[i].Message = err.Error()
			}
		})
		if !s.sleep(retryInterval) {
			return nil, false
		}
	}
}

// sleep waits d; it returns false when the pod is stopped first.
func (s *Sandbox) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

func (s *Sandbox) enforceDeadline(at time.Time, runDone <-chan struct{}) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
	case <-runDone:
		return
	case <-s.stop:
		return
	}
	s.log.Info("active deadline exceeded")
	s.update(func(sn *podstatus.Snapshot) {
		sn.Failed = true
		sn.Reason, sn.Message = podstatus.ReasonDeadlineExceeded, podstatus.MessageDeadlineExceeded
	})
	s.Stop(s.gracePeriod())
}

// gracePeriod is the pod's terminationGracePeriodSeconds, capped.
func (s *Sandbox) gracePeriod() time.Duration {
	g := MaxGrace
	if p := s.pod.Spec.TerminationGracePeriodSeconds; p != nil {
		g = min(time.Duration(*p)*time.Second, MaxGrace)
	}
	return max(g, 0)
}

// Stop terminates the pod: SIGTERM to every process group now, SIGKILL to
// what is left after grace (0: SIGKILL at once). No container starts or
// restarts afterwards. A second call can only shorten the grace period.
// Stop does not wait; Done tells when the processes are gone.
func (s *Sandbox) Stop(grace time.Duration) {
	grace = min(max(grace, 0), MaxGrace)
	at := time.Now().Add(grace)
	s.mu.Lock()
	first := !s.stopping
	if !first && !at.Before(s.killAt) {
		s.mu.Unlock()
		return
	}
	s.stopping, s.killAt = true, at
	procs := s.runningLocked()
	if first {
		close(s.stop)
		if !s.finished {
			s.killerWG.Go(s.killer)
		}
	}
	s.mu.Unlock()

	if !first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
		return
	}
	sig := syscall.SIGTERM
	if grace == 0 {
		sig = syscall.SIGKILL
	}
	for _, p := range procs {
		p.Signal(sig)
	}
}

// killer sends SIGKILL to every process left when the kill time comes.
func (s *Sandbox) killer() {
	for {
		s.mu.Lock()
		at := s.killAt
		s.mu.Unlock()
		t := time.NewTimer(time.Until(at))
		select {
		case <-t.C:
			s.mu.Lock()
			procs := s.runningLocked()
			s.mu.Unlock()
			for _, p := range procs {
				p.Signal(syscall.SIGKILL)
			}
			return
		case <-s.wake:
			t.Stop()
		case <-s.exited:
			t.Stop()
			return
		}
	}
}

func (s *Sandbox) runningLocked() []*proc.Process {
	out := make([]*proc.Process, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p)
	}
	return out
}
