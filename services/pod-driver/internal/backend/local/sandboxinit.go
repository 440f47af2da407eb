package local

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

// init runs a sandbox stage when this executable was re-executed as one
// (sandbox.go): every binary that links the local backend can be its own
// sandbox init. It never returns then.
func init() {
	raw, ok := os.LookupEnv(sandboxEnv)
	if !ok {
		return
	}
	var spec sandboxSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: bad spec: %v\n", err)
		os.Exit(sandboxSetupFailed)
	}
	switch spec.Stage {
	case 1:
		os.Exit(sandboxStage1(spec))
	case 2:
		os.Exit(sandboxStage2(spec))
	}
	fmt.Fprintf(os.Stderr, "telorunner sandbox: unknown stage %d\n", spec.Stage)
	os.Exit(sandboxSetupFailed)
}

// sandboxStage1 is PID 1 of the sandbox: it builds the mounts, starts
// stage 2 in its own user namespace and reaps until stage 2 exits, then
// exits with its status.
func sandboxStage1(spec sandboxSpec) int {
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
			return sandboxSetupFailed
		}
	}
	if err := buildMounts(spec); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
		return sandboxSetupFailed
	}
	cmd := &exec.Cmd{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxInnerID, HostID: spec.UID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxInnerID, HostID: spec.GID, Size: 1}},
			Credential:  &syscall.Credential{Uid: sandboxInnerID, Gid: sandboxInnerID, NoSetGroups: true},
		},
	}
	if len(spec.Cgroups) > 0 && spec.ProgramFD && !spec.Probe {
		// The cgroups hold memory and processes: the program can start
		// straight from here, without a stage 2 (one exec of this large
		// binary less). no_new_privs is per thread and inherited: the
		// fork happens on this locked one.
		runtime.LockOSThread()
		if err := setLimits(spec, false); err != nil {
			fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
			return sandboxSetupFailed
		}
		cmd.Path = "/proc/self/fd/" + strconv.Itoa(sandboxProgramFD)
		cmd.Args, cmd.Env, cmd.Dir = spec.Argv, spec.Env, spec.Dir
	} else {
		next := spec
		next.Stage = 2
		data, err := json.Marshal(next)
		if err != nil {
			fmt.Fprintf(os.Stderr, "telorunner sandbox: %v\n", err)
			return sandboxSetupFailed
		}
		cmd.Path, cmd.Args, cmd.Dir = "/proc/self/exe", []string{"telorunner-sandbox"}, "/"
		cmd.Env = []string{sandboxEnv + "=" + string(data)}
	}
	if spec.ProgramFD {
		cmd.ExtraFiles = []*os.File{os.NewFile(sandboxProgramFD, "program")}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: start workload: %v\n", err)
		return sandboxSetupFailed
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
			return sandboxSetupFailed
		case pid != child:
			continue // an orphan re-parented to this init
		case ws.Signaled():
			return 128 + int(ws.Signal())
		default:
			return ws.ExitStatus()
		}
	}
}

// buildMounts makes the sandbox's view of the file system, in this
// process's new mount namespace.
func buildMounts(spec sandboxSpec) error {
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

// sandboxStage2 runs as the unprivileged sandbox uid: it sets the limits
// and execs the program.
func sandboxStage2(spec sandboxSpec) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "telorunner sandbox: "+format+"\n", args...)
		return sandboxExecFailed
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
		prog = "/proc/self/fd/" + strconv.Itoa(sandboxProgramFD)
	} else if spec.ProgramFD {
		unix.CloseOnExec(sandboxProgramFD)
	}
	err := syscall.Exec(prog, spec.Argv, spec.Env)
	return fail("exec %s: %v", spec.Program, err)
}

// setLimits sets no_new_privs on this thread and the rlimits of spec on
// this process; memory and process rlimits only when all is set (stage 2:
// without cgroups, spec carries them).
func setLimits(spec sandboxSpec, all bool) error {
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
