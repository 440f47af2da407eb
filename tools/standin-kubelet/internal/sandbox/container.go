package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podstatus"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/proc"
)

// exitStartError is the exit code reported when a program cannot be
// started at all, as runc reports it.
const exitStartError = 128

// runContainer runs one container until it ends for good and reports
// whether its last run exited 0. Init containers restart on failure unless
// the pod's restartPolicy is Never; containers follow restartPolicy.
func (s *Sandbox) runContainer(ctx context.Context, isInit bool, i int, vols map[string]volume) bool {
	c := &s.pod.Spec.Containers[i]
	if isInit {
		c = &s.pod.Spec.InitContainers[i]
	}
	rec := func(sn *podstatus.Snapshot) *podstatus.Container {
		if isInit {
			return &sn.Init[i]
		}
		return &sn.Containers[i]
	}
	log := s.log.With("container", c.Name)
	policy := s.pod.Spec.RestartPolicy

	for {
		if s.stopped() {
			return false
		}
		spec, reason, err := s.processSpec(ctx, c, vols)
		if err != nil {
			log.Warn("prepare container", "reason", reason, "err", err)
			s.update(func(sn *podstatus.Snapshot) {
				r := rec(sn)
				r.Reason, r.Message = reason, err.Error()
			})
			var pe permanentError
			if reason == podstatus.ReasonErrImagePull || errors.As(err, &pe) {
				<-s.stop // the image map and the pod's spec never change
				return false
			}
			if !s.sleep(retryInterval) {
				return false
			}
			continue
		}
		spec.Log = log

		var term podstatus.Termination
		p, err := proc.Start(spec)
		if err != nil {
			log.Warn("start container", "err", err)
			now := time.Now()
			term = podstatus.Termination{ExitCode: exitStartError, Reason: podstatus.ReasonStartError,
				Message: err.Error(), StartedAt: now, FinishedAt: now}
		} else {
			id := fmt.Sprintf("standin://%d", p.Pid())
			s.register(c.Name, p)
			if spec.Identity != nil {
				log.Debug("container started", "pid", p.Pid(), "uid", spec.Identity.UID, "gid", spec.Identity.GID, "groups", spec.Identity.Groups)
			} else {
				log.Debug("container started", "pid", p.Pid())
			}
			s.update(func(sn *podstatus.Snapshot) {
				r := rec(sn)
				r.State, r.Reason, r.Message = podstatus.Running, "", ""
				r.StartedAt, r.ContainerID, r.Terminated = p.StartedAt(), id, nil
			})
			exit := p.Exit()
			s.unregister(c.Name, p)
			term = podstatus.Termination{ExitCode: int32(exit.Code), Signal: int32(exit.Signal),
				Reason: podstatus.ReasonCompleted, StartedAt: p.StartedAt(), FinishedAt: exit.At, ContainerID: id}
			if exit.Code != 0 {
				term.Reason = podstatus.ReasonError
			}
			log.Debug("container exited", "code", exit.Code)
		}

		restart := !s.stopped() && (policy == v1.RestartPolicyAlways && !isInit ||
			policy != v1.RestartPolicyNever && term.ExitCode != 0)
		if !restart {
			s.update(func(sn *podstatus.Snapshot) {
				r := rec(sn)
				r.State, r.Terminated = podstatus.Terminated, &term
			})
			return term.ExitCode == 0
		}
		s.update(func(sn *podstatus.Snapshot) {
			r := rec(sn)
			r.State, r.Last = podstatus.Waiting, &term
			r.Reason = podstatus.ReasonCrashLoopBackOff
			r.Message = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", restartBackoff, c.Name, s.pod.Name)
		})
		if !s.sleep(restartBackoff) {
			return false
		}
		s.update(func(sn *podstatus.Snapshot) { rec(sn).RestartCount++ })
	}
}

// permanentError is a reason not to start a container that retrying cannot
// change.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// processSpec resolves everything a container needs to start; reason says
// why it cannot (ErrImagePull, CreateContainerConfigError).
func (s *Sandbox) processSpec(ctx context.Context, c *v1.Container, vols map[string]volume) (proc.Spec, string, error) {
	program, ok := s.cfg.Images.Lookup(c.Image)
	if !ok {
		return proc.Spec{}, podstatus.ReasonErrImagePull,
			fmt.Errorf("image %q is not mapped to a program (--image-map)", c.Image)
	}
	var id *identity.Identity
	home := "/root"
	if s.cfg.ApplyIdentity {
		// Checked where the kubelet checks it, after the image and
		// before anything else of the container's config.
		if err := identity.VerifyRunAsNonRoot(s.pod, c); err != nil {
			return proc.Spec{}, podstatus.ReasonConfigError, permanentError{err}
		}
		resolved := identity.Resolve(s.pod, c)
		id, home = &resolved, resolved.Home()
	}
	var volDirs map[string]string
	if s.cfg.Volumes == VolumesEnv {
		volDirs = map[string]string{}
		for name, v := range vols {
			volDirs[name] = v.path
		}
	}
	env, err := s.containerEnv(ctx, c, program, home, volDirs)
	if err != nil {
		return proc.Spec{}, podstatus.ReasonConfigError, err
	}
	path, argv := command(c, program, env.vals)
	spec := proc.Spec{
		Path:      path,
		Argv:      argv,
		Env:       env.environ(),
		TTY:       c.TTY,
		Stdin:     c.Stdin,
		StdinOnce: c.StdinOnce,
		Identity:  id,
	}
	ms, err := mounts(c, vols, env.vals)
	if err != nil {
		return proc.Spec{}, podstatus.ReasonConfigError, err
	}
	switch {
	case s.cfg.Volumes == VolumesMount && (len(ms) > 0 || id != nil && !id.Root()):
		// Only containers that mount something or run as another user
		// than root pay for the helper (a re-exec of the kubelet binary,
		// some tens of milliseconds). Another user may not be able to
		// search the path of the pod directory or of the program (under
		// --root, in a 0700 temporary directory): the helper reaches
		// them through descriptors opened as root.
		spec.Helper = s.cfg.Helper
		spec.Mount = &mountns.Spec{Mounts: ms, Dir: c.WorkingDir, FallbackDir: s.cfg.Dir, Path: path}
	default:
		spec.Dir = s.cfg.Dir
		if fi, err := os.Stat(c.WorkingDir); c.WorkingDir != "" && err == nil && fi.IsDir() {
			spec.Dir = c.WorkingDir
		}
	}
	return spec, "", nil
}

func (s *Sandbox) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// register makes p visible to Stop and Attach; a process that starts while
// the pod is stopping is signalled at once.
func (s *Sandbox) register(name string, p *proc.Process) {
	s.mu.Lock()
	s.procs[name] = p
	s.last[name] = p
	stopping, killNow := s.stopping, !time.Now().Before(s.killAt)
	s.mu.Unlock()
	if stopping {
		if killNow {
			p.Signal(syscall.SIGKILL)
		} else {
			p.Signal(syscall.SIGTERM)
		}
	}
}

func (s *Sandbox) unregister(name string, p *proc.Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs[name] == p {
		delete(s.procs, name)
	}
}

// Log returns the output of container's last process (running or
// exited), as a kubelet serves pods/log; ErrNoContainer for a container
// the pod does not have, proc.ErrNotRunning for one that never started.
func (s *Sandbox) Log(container string) ([]byte, error) {
	known := false
	for _, c := range s.pod.Spec.Containers {
		known = known || c.Name == container
	}
	for _, c := range s.pod.Spec.InitContainers {
		known = known || c.Name == container
	}
	if !known {
		return nil, fmt.Errorf("log %s: %w", container, ErrNoContainer)
	}
	s.mu.Lock()
	p := s.last[container]
	s.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("log %s: %w", container, proc.ErrNotRunning)
	}
	return p.Log(), nil
}

// ErrNoContainer is returned by Attach for a container the pod does not run.
var ErrNoContainer = errors.New("no such container")

// Attach connects a session to a running container; see proc.Attach.
func (s *Sandbox) Attach(ctx context.Context, container string, in io.Reader, out, errw io.Writer, resize <-chan proc.Size) error {
	known := false
	for _, c := range s.pod.Spec.Containers {
		known = known || c.Name == container
	}
	for _, c := range s.pod.Spec.InitContainers {
		known = known || c.Name == container
	}
	if !known {
		return fmt.Errorf("attach %s: %w", container, ErrNoContainer)
	}
	s.mu.Lock()
	p := s.procs[container]
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("attach %s: %w", container, proc.ErrNotRunning)
	}
	return p.Attach(ctx, in, out, errw, resize)
}
