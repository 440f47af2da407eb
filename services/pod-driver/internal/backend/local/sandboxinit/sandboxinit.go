// Package sandboxinit is the init of the local backend's sandbox (see
// ../sandbox.go): the two stages a sandboxed process starts through. It
// imports little on purpose: the small telorunner-sandbox program
// (cmd/telorunner-sandbox) is this package alone, so starting a sandbox
// costs one exec of a ~2 MB binary rather than of the whole runner. Any
// binary that links this package can also be its own sandbox init: its
// init runs the stage named in Env and never returns then.
package sandboxinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// Env carries the stage's spec (JSON) to the init.
	Env = "TELORUNNER_SANDBOX_STAGE"
	// Argv0 is the name the init runs under.
	Argv0 = "telorunner-sandbox"
	// ProgramFD is the descriptor of the program in both stages (the first
	// of ExtraFiles).
	ProgramFD = 3
	// InnerID is the uid and gid a workload has inside its namespace (the
	// Kubernetes pods' runAsUser, contract 11.3).
	InnerID = 1000
	// SetupFailed is stage 1's exit status when it could not build the
	// sandbox; ExecFailed stage 2's when it could not exec.
	SetupFailed = 125
	ExecFailed  = 127
)

// Spec is what a stage is told, as JSON in Env.
type Spec struct {
	Stage int  `json:"stage"`
	Probe bool `json:"probe,omitempty"`
	// Stage 1.
	Privileged bool     `json:"privileged,omitempty"` // real root: map stage 2 to UID/GID, open unsearchable paths
	UID        int      `json:"uid"`                  // stage 2's id in stage 1's user namespace
	GID        int      `json:"gid"`
	Hide       []string `json:"hide,omitempty"`
	ReadOnly   []string `json:"readOnly,omitempty"` // bound read-only at the same path
	Writable   []string `json:"writable,omitempty"` // bound read-write at the same path, after ReadOnly
	TmpBytes   int64    `json:"tmpBytes,omitempty"`
	Cgroups    []string `json:"cgroups,omitempty"` // cgroup.procs files to join first
	// Stage 2.
	Dir       string   `json:"dir,omitempty"`
	Program   string   `json:"program,omitempty"`
	ProgramFD bool     `json:"programFD,omitempty"` // the program is open on ProgramFD
	Argv      []string `json:"argv,omitempty"`
	Env       []string `json:"env,omitempty"`
	Memory    int64    `json:"memory,omitempty"`
	Procs     int      `json:"procs,omitempty"`
	Files     int      `json:"files,omitempty"`
	// Nice is the niceness of the init and everything it starts (0: the
	// runner's own).
	Nice int `json:"nice,omitempty"`
}

// init runs a sandbox stage when this executable was started as one.
func init() {
	raw, ok := os.LookupEnv(Env)
	if !ok {
		return
	}
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: bad spec: %v\n", err)
		os.Exit(SetupFailed)
	}
	switch spec.Stage {
	case 1:
		os.Exit(stage1(spec))
	case 2:
		os.Exit(stage2(spec))
	}
	fmt.Fprintf(os.Stderr, "telorunner sandbox: unknown stage %d\n", spec.Stage)
	os.Exit(SetupFailed)
}

// stage1 is PID 1 of the sandbox: it builds the mounts, starts
// stage 2 in its own user namespace and reaps until stage 2 exits, then
// exits with its status.
func stage1(spec Spec) int {
	// Signals for the process group reach stage 2 too; this init only
	// outlives them (a PID 1 without handlers would ignore them anyway).
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGWINCH)
	go func() {
		for range sigs { //nolint:revive // dropped: the group got them
		}
	}()
	for _, procs := range spec.Cgroups {
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			fmt.Fprintf(os.Stderr, "telorunner sandbox: join cgroup: %v\n", err)
			return SetupFailed
		}
	}
	if err := buildMounts(spec); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
		return SetupFailed
	}
	// After the mounts: /proc is this PID namespace's now, and its thread
	// ids are the ones setpriority takes here.
	if err := renice(spec.Nice); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
		return SetupFailed
	}
	cmd := &exec.Cmd{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: InnerID, HostID: spec.UID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: InnerID, HostID: spec.GID, Size: 1}},
			Credential:  &syscall.Credential{Uid: InnerID, Gid: InnerID, NoSetGroups: true},
		},
	}
	if len(spec.Cgroups) > 0 && spec.ProgramFD && !spec.Probe {
		// The cgroups hold memory and processes: the program can start
		// straight from here, without a stage 2 (one exec less). no_new_privs is per thread and inherited: the
		// fork happens on this locked one.
		runtime.LockOSThread()
		if err := setLimits(spec, false); err != nil {
			fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
			return SetupFailed
		}
		cmd.Path = "/proc/self/fd/" + strconv.Itoa(ProgramFD)
		cmd.Args, cmd.Env, cmd.Dir = spec.Argv, spec.Env, spec.Dir
	} else {
		next := spec
		next.Stage = 2
		data, err := json.Marshal(next)
		if err != nil {
			fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
			return SetupFailed
		}
		cmd.Path, cmd.Args, cmd.Dir = "/proc/self/exe", []string{Argv0}, "/"
		cmd.Env = []string{Env + "=" + string(data)}
	}
	if spec.ProgramFD {
		cmd.ExtraFiles = []*os.File{os.NewFile(ProgramFD, "program")}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: start workload: %v\n", err)
		return SetupFailed
	}
	if spec.ProgramFD {
		_ = cmd.ExtraFiles[0].Close() // stage 2 has it
	}
	child := cmd.Process.Pid
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			fmt.Fprintf(os.Stderr, "telorunner sandbox: wait: %v\n", err)
			return SetupFailed
		case pid != child:
			continue // an orphan re-parented to this init
		case ws.Signaled():
			return 128 + int(ws.Signal())
		default:
			return ws.ExitStatus()
		}
	}
}

// renice gives every thread of this process niceness nice (Linux keeps it
// per thread; a thread or process started later inherits its creator's).
// A niceness at or below this process's own is left as it is: lowering it
// takes a privilege, and the sandbox never raises a workload's priority.
func renice(nice int) error {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0) // 20 - niceness (the raw syscall)
	if err != nil {
		return fmt.Errorf("renice: %w", err)
	}
	if nice <= 20-raw {
		return nil
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("renice: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("renice to %d: %w", nice, err)
		}
	}
	return nil
}

// buildMounts makes the sandbox's view of the file system, in this
// process's new mount namespace.
func buildMounts(spec Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// Clones of the directories to bind, taken before anything is hidden
	// or made read-only.
	type bind struct {
		path string
		fd   int
		ro   bool
	}
	var binds []bind
	defer func() {
		for _, b := range binds {
			_ = unix.Close(b.fd)
		}
	}()
	for i, path := range append(append([]string{}, spec.ReadOnly...), spec.Writable...) {
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("clone %s: %w", path, err)
		}
		binds = append(binds, bind{path: path, fd: fd, ro: i < len(spec.ReadOnly)})
	}
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, ro); err != nil {
		return fmt.Errorf("make the host tree read-only: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	tmpBytes := spec.TmpBytes
	if tmpBytes <= 0 {
		tmpBytes = 64 << 20
	}
	if err := mountTmpfs("/tmp", "mode=1777,size="+strconv.FormatInt(tmpBytes, 10)); err != nil {
		return err
	}
	var covers []string // tmpfs this init mounted, made read-only at the end
	for _, path := range spec.Hide {
		if _, err := os.Stat(path); err != nil {
			continue // nothing there to hide (under /tmp: already gone)
		}
		if err := mountTmpfs(path, "mode=0755,size=1m"); err != nil {
			return err
		}
		covers = append(covers, path)
	}
	for _, b := range binds {
		if spec.Privileged {
			opened, err := openAncestors(b.path)
			if err != nil {
				return err
			}
			covers = append(covers, opened...)
		}
		if err := os.MkdirAll(b.path, 0o755); err != nil {
			return fmt.Errorf("make mount point %s: %w", b.path, err)
		}
		if b.ro {
			if err := unix.MountSetattr(b.fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, ro); err != nil {
				return fmt.Errorf("make %s read-only: %w", b.path, err)
			}
		}
		if err := unix.MoveMount(b.fd, "", unix.AT_FDCWD, b.path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("bind %s: %w", b.path, err)
		}
	}
	for _, path := range covers {
		if err := unix.MountSetattr(unix.AT_FDCWD, path, 0, ro); err != nil {
			return fmt.Errorf("make %s read-only: %w", path, err)
		}
	}
	return nil
}

func mountTmpfs(path, opts string) error {
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", path, err)
	}
	return nil
}

// openAncestors covers with an empty tmpfs the highest ancestor of path
// that others cannot search (a 0700 home or temp directory), so the
// sandbox uid can reach path's mount point. What that directory held is
// hidden. It returns the paths it covered.
func openAncestors(path string) ([]string, error) {
	var covered []string
	dir := "/"
	for _, part := range strings.Split(strings.TrimPrefix(filepath.Clean(path), "/"), "/") {
		if part == "" {
			break
		}
		dir = filepath.Join(dir, part)
		if dir == path {
			break
		}
		st, err := os.Stat(dir)
		if err != nil {
			break // below a tmpfs of ours: created searchable
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := mountTmpfs(dir, "mode=0755,size=1m"); err != nil {
				return nil, err
			}
			covered = append(covered, dir)
			if err := os.MkdirAll(path, 0o755); err != nil {
				return nil, fmt.Errorf("make mount point %s: %w", path, err)
			}
		}
	}
	return covered, nil
}

// stage2 runs as the unprivileged sandbox uid: it sets the limits
// and execs the program.
func stage2(spec Spec) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: "+format+"\n", args...)
		return ExecFailed
	}
	if err := setLimits(spec, true); err != nil {
		return fail("%v", err)
	}
	if spec.Probe {
		return 0
	}
	if err := os.Chdir(spec.Dir); err != nil {
		return fail("%v", err)
	}
	prog := spec.Program
	if spec.ProgramFD && unix.Access(prog, unix.X_OK) != nil {
		prog = "/proc/self/fd/" + strconv.Itoa(ProgramFD)
	} else if spec.ProgramFD {
		unix.CloseOnExec(ProgramFD)
	}
	err := syscall.Exec(prog, spec.Argv, spec.Env)
	return fail("exec %s: %v", spec.Program, err)
}

// setLimits sets no_new_privs on this thread and the rlimits of spec on
// this process; memory and process rlimits only when all is set (stage 2:
// without cgroups, spec carries them).
func setLimits(spec Spec, all bool) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	for _, l := range []struct {
		name     string
		resource int
		v        int64
	}{
		{"memory", unix.RLIMIT_DATA, spec.Memory},
		{"processes", unix.RLIMIT_NPROC, int64(spec.Procs)},
		{"open files", unix.RLIMIT_NOFILE, int64(spec.Files)},
		{"core size", unix.RLIMIT_CORE, 0},
	} {
		if l.v < 0 || l.v == 0 && l.resource != unix.RLIMIT_CORE {
			continue
		}
		if !all && (l.resource == unix.RLIMIT_DATA || l.resource == unix.RLIMIT_NPROC) {
			continue
		}
		// syscall.Setrlimit, not unix: the runtime then hands this
		// RLIMIT_NOFILE to the exec'd program instead of its saved one.
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: uint64(l.v), Max: uint64(l.v)}); err != nil {
			return fmt.Errorf("limit %s to %d: %w", l.name, l.v, err)
		}
	}
	return nil
}
