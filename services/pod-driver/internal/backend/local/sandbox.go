package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local/sandboxinit"
)

// The local sandbox (issue 18): every process the local backend starts
// (app kernels, the workspace server and the agent of watch sessions) runs
// in its own user, mount and PID namespaces, with no container engine and
// no daemon. A small init (package sandboxinit: the telorunner-sandbox
// program, or the runner's own executable re-executed when that program is
// not installed beside it) builds it in two stages:
//
//   - stage 1 is cloned by the runner into new mount and PID namespaces
//     (and a new user namespace mapping itself to the runner's ids when the
//     runner is not root). It is PID 1 there: it makes the whole host tree
//     read-only, mounts a fresh /proc, a private /tmp, empty tmpfs over the
//     runner's data dir and the sessions root, binds the session's own
//     directories back, then starts stage 2 and reaps until it exits. Its
//     exit status is stage 2's (128+signal for a signal death); when it
//     exits the kernel kills everything left in the namespace. Its host
//     pid is the pid the backend holds and the process group it signals.
//   - stage 2 is cloned by stage 1 into a user namespace of its own as an
//     unprivileged uid (1000 inside; RUNNER_SANDBOX_UID on the host when the
//     runner is root, else the runner's uid), so it holds no capability
//     over the mounts; it sets no_new_privs and the rlimits (memory,
//     processes, open files) and execs the program. When cgroups hold
//     memory and processes (root), stage 1 sets no_new_privs and the open
//     files limit on itself and clones the program directly in that user
//     namespace instead: one exec less per process.
//
// Ports stay on the host network: there is no network namespace.

// Sandbox defaults.
const (
	DefaultSandboxUID      = 65534
	DefaultSandboxMaxProcs = 256
	DefaultSandboxMaxFiles = 4096
	// DefaultSandboxNice is RUNNER_SANDBOX_NICE's default.
	DefaultSandboxNice = 10
	probeTimeout       = 20 * time.Second
)

// SandboxOptions configures the sandbox of local workloads.
type SandboxOptions struct {
	// Off runs workloads as plain host processes (RUNNER_LOCAL_SANDBOX=off).
	Off bool
	// UID and GID are the host ids workloads run as when the runner runs as
	// root (RUNNER_SANDBOX_UID / RUNNER_SANDBOX_GID; 0: 65534). An
	// unprivileged runner maps workloads to its own ids.
	UID, GID int
	// Hide are host paths covered by an empty read-only tmpfs inside every
	// sandbox (the runner's data dir). The work root is always hidden.
	Hide []string
	// MaxProcs and MaxFiles are the RLIMIT_NPROC and RLIMIT_NOFILE of every
	// workload process (0: 256 and 4096).
	MaxProcs, MaxFiles int
	// Nice is the niceness of every workload process (0-19; 0: the
	// runner's own). A workload that spins then yields the CPU to the
	// runner's own work: the editor's API, terminal and event streams stay
	// responsive. Never below the runner's own niceness.
	Nice int
	// Init is the sandbox init program. Empty: telorunner-sandbox beside
	// this executable when it is there, else this executable itself
	// (every binary linking this package is also an init, but starting
	// the whole runner costs tens of milliseconds of CPU per process).
	Init string
}

// Ceilings are the limits of one kind of session (contract 11.2).
type Ceilings struct {
	// TTL is the run-time ceiling, enforced by the backend (0: none).
	TTL time.Duration
	// MemoryBytes is each process's RLIMIT_DATA in the sandbox (0: none).
	MemoryBytes int64
	// TmpBytes is the size of the sandbox's private /tmp (0: 64 MiB).
	TmpBytes int64
}

// Default ceilings (contract 11.2 and 18).
var (
	DefaultRunCeilings   = Ceilings{TTL: 3600 * time.Second, MemoryBytes: 100 << 20, TmpBytes: 512 << 20}
	DefaultAppCeilings   = Ceilings{TTL: 21600 * time.Second, MemoryBytes: 512 << 20, TmpBytes: 1 << 30}
	DefaultWatchCeilings = Ceilings{TTL: 21600 * time.Second, MemoryBytes: 512 << 20, TmpBytes: 1 << 30}
)

// sandbox turns commands into sandboxed ones. The zero value (nil) runs
// them unchanged.
type sandbox struct {
	exe        string // the init program (SandboxOptions.Init)
	opts       SandboxOptions
	privileged bool
	hide       []string       // opts.Hide and the work root, absolute
	cleanups   sync.WaitGroup // cgroup removals after sandboxes ended
	cgroups    *cgroupV1      // nil: rlimits only
	err        error          // why sandboxes cannot be made here (the probe failed)
}

// newSandbox prepares the sandbox and probes it by building one. A probe
// failure is kept in err: Start then refuses sessions.
func newSandbox(opts SandboxOptions, workRoot string) *sandbox {
	if opts.UID == 0 {
		opts.UID = DefaultSandboxUID
	}
	if opts.GID == 0 {
		opts.GID = opts.UID
	}
	if opts.MaxProcs == 0 {
		opts.MaxProcs = DefaultSandboxMaxProcs
	}
	if opts.MaxFiles == 0 {
		opts.MaxFiles = DefaultSandboxMaxFiles
	}
	s := &sandbox{opts: opts, privileged: os.Geteuid() == 0}
	for _, p := range append(slices.Clone(opts.Hide), workRoot) {
		if abs, err := filepath.Abs(p); err == nil && !slices.Contains(s.hide, abs) {
			s.hide = append(s.hide, abs)
		}
	}
	exe, err := initProgram(opts.Init)
	if err != nil {
		s.err = err
		return s
	}
	s.exe = exe
	if s.privileged {
		cg, err := newCgroupV1()
		if err == nil {
			s.cgroups = cg
		}
	}
	s.err = s.probe()
	return s
}

// initProgram is the sandbox init to run: init when set, else
// telorunner-sandbox beside this executable, else this executable.
func initProgram(init string) (string, error) {
	if init != "" {
		return init, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this executable: %w", err)
	}
	return initBeside(self), nil
}

// initBeside is telorunner-sandbox in self's directory when it is an
// executable file there, else self.
func initBeside(self string) string {
	beside := filepath.Join(filepath.Dir(self), sandboxinit.Argv0)
	if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return beside
	}
	return self
}

// close releases what the sandbox holds on the host (its cgroups).
func (s *sandbox) close() {
	if s != nil {
		s.cleanups.Wait()
		s.cgroups.close()
	}
}

// unavailable is the start failure when sandboxes cannot be made.
func (s *sandbox) unavailable() error {
	return fmt.Errorf("the local sandbox is unavailable on this machine (%v); set RUNNER_LOCAL_SANDBOX=off to run sessions as plain host processes", s.err)
}

// probe builds a sandbox whose stage 2 sets its limits and exits.
func (s *sandbox) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.exe)
	spec, remove, err := s.spec(procSandbox{Ceilings: DefaultRunCeilings})
	if err != nil {
		return err
	}
	defer remove()
	spec.Probe = true
	if err := s.apply(cmd, spec, nil); err != nil {
		return err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("probe: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// procSandbox is what one process's sandbox holds beyond the defaults.
type procSandbox struct {
	ReadOnly []string // bound read-only (the session directory)
	Writable []string // bound read-write (its app, home, workspace)
	Ceilings Ceilings
}

// spec is stage 1's spec for ps, with its cgroups created when the runner
// has them; remove deletes those once the sandbox has ended.
func (s *sandbox) spec(ps procSandbox) (spec sandboxinit.Spec, remove func(), err error) {
	spec = sandboxinit.Spec{
		Stage: 1, Privileged: s.privileged,
		Hide: s.hide, ReadOnly: ps.ReadOnly, Writable: ps.Writable,
		TmpBytes: ps.Ceilings.TmpBytes, Files: s.opts.MaxFiles, Nice: s.opts.Nice,
	}
	if s.privileged {
		spec.UID, spec.GID = s.opts.UID, s.opts.GID
	}
	remove = func() {}
	if s.cgroups != nil {
		var rm func()
		if spec.Cgroups, rm, err = s.cgroups.group(ps.Ceilings.MemoryBytes, s.opts.MaxProcs); err != nil {
			return spec, nil, err
		}
		// In the background: the namespace's last processes may take a
		// moment to leave, and the workload's end must not wait for that.
		return spec, func() { s.cleanups.Go(rm) }, nil
	}
	// No cgroup: rlimits per process. RLIMIT_DATA counts the address space
	// runtimes reserve up front (Go maps its heap arenas, glibc 8 MiB per
	// thread stack), so it is set at rlimitMemoryFactor times the ceiling.
	if ps.Ceilings.MemoryBytes > 0 {
		spec.Memory = max(ps.Ceilings.MemoryBytes*rlimitMemoryFactor, rlimitMemoryFloor)
	}
	spec.Procs = s.opts.MaxProcs
	return spec, remove, nil
}

// The rlimit stand-in for a memory ceiling without cgroups.
const (
	rlimitMemoryFactor = 4
	rlimitMemoryFloor  = 512 << 20
)

// wrap turns cmd into the stage 1 of a sandbox that runs cmd's program
// with cmd's argv, env and dir. cmd.SysProcAttr gets the clone flags and
// id mappings; the caller adds its process-group and terminal settings to
// it. The returned release closes the program descriptor: call it once
// cmd has started (or failed to); cleanup removes the sandbox's host
// state (its cgroups): call it once the process has been reaped.
func (s *sandbox) wrap(cmd *exec.Cmd, ps procSandbox) (release, cleanup func(), err error) {
	if s == nil {
		return func() {}, func() {}, nil
	}
	if s.err != nil {
		return nil, nil, s.unavailable()
	}
	spec, cleanup, err := s.spec(ps)
	if err != nil {
		return nil, nil, err
	}
	spec.Dir, spec.Program, spec.Argv, spec.Env = cmd.Dir, cmd.Path, cmd.Args, cmd.Env
	if spec.Env == nil {
		spec.Env = []string{}
	}
	// The program may sit where the sandbox uid cannot search (a 0700
	// directory of the runner): stage 2 then execs it from this descriptor.
	prog, err := os.Open(cmd.Path)
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	} else if err == nil {
		// Fail here, as an unsandboxed start would, rather than in stage 2.
		if st, serr := prog.Stat(); serr == nil && (!st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0) {
			_ = prog.Close() // read-only
			err = syscall.EACCES
		}
	}
	if err != nil {
		cleanup()
		return nil, nil, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: err}
	}
	spec.ProgramFD = true
	if err := s.apply(cmd, spec, prog); err != nil {
		_ = prog.Close() // read-only
		cleanup()
		return nil, nil, err
	}
	return func() { _ = prog.Close() }, cleanup, nil // the child has its copy
}

// apply makes cmd run stage 1 with spec.
func (s *sandbox) apply(cmd *exec.Cmd, spec sandboxinit.Spec, prog *os.File) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode sandbox spec: %w", err)
	}
	cmd.Path = s.exe
	cmd.Args = []string{sandboxinit.Argv0}
	cmd.Env = []string{sandboxinit.Env + "=" + string(data)}
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	// Otherwise stage 1 starts in the program's directory too: from its
	// first moment the workload's processes are found by where they work.
	if prog != nil {
		cmd.ExtraFiles = []*os.File{prog}
	}
	attrs := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID}
	if !s.privileged {
		attrs.Cloneflags |= syscall.CLONE_NEWUSER
		attrs.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attrs.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		attrs.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attrs
	return nil
}

// chownForSandbox gives the sandbox uid the paths a workload writes (its
// app, home or workspace tree) and lets it search the session directory
// (0711). A no-op unless the runner is root.
func (s *sandbox) chownForSandbox(sessionRoot string, writable ...string) error {
	if s == nil || !s.privileged {
		return nil
	}
	if err := os.Chmod(sessionRoot, 0o711); err != nil {
		return fmt.Errorf("open session directory to the sandbox: %w", err)
	}
	for _, dir := range writable {
		err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, s.opts.UID, s.opts.GID)
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("give %s to the sandbox uid: %w", dir, err)
		}
	}
	return nil
}
