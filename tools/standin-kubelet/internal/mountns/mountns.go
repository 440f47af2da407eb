// Package mountns runs a container's program in its own mount namespace with
// the pod's volumes bind-mounted at their mountPath.
//
// Go cannot mount between fork and exec, so the stand-in kubelet re-executes
// its own binary as a small helper: the child is created with
// CLONE_NEWNS (Go then makes "/" recursively private), the helper opens every
// volume source, bind-mounts them in path order, changes directory and execs
// the real program under the same pid. A mount that covers a source or the
// program itself (an emptyDir at /tmp over a volume or a binary under /tmp)
// is harmless because sources are opened before anything is mounted.
//
// When the spec carries an identity, the helper switches to it after
// mounting and changing directory and before exec'ing (setgroups, setgid,
// setuid), as a container runtime does. The program, its directory and the
// PATH entries stay reachable even when the new user cannot search their
// path on the host (a directory under a 0700 temporary directory): they
// were opened as root and are then used as /proc/self/fd/N.
//
// Every binary that can act as the helper must call Main first thing in
// main (and in TestMain of tests that start containers).
package mountns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
)

// envSpec carries the JSON Spec from the kubelet to the helper.
const envSpec = "STANDIN_KUBELET_MOUNT_HELPER"

// helperArg0 is argv[0] of the helper, visible in ps.
const helperArg0 = "standin-kubelet-mount-helper"

// exitHelperFailed is the helper's exit status when it cannot exec the program.
const exitHelperFailed = 127

// Mount is one bind mount: the host path Source appears at Target.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Spec is what the helper does before it execs the program.
type Spec struct {
	Mounts []Mount `json:"mounts"`
	// Dir is the working directory inside the namespace; when it is empty
	// or does not exist there, FallbackDir (a host path) is used.
	Dir         string `json:"dir,omitempty"`
	FallbackDir string `json:"fallbackDir"`
	// Path is the absolute path of the program; argv comes from the
	// helper's own arguments.
	Path string `json:"path"`
	// Identity, when set, is what the program runs as; nil keeps the
	// helper's own (root).
	Identity *identity.Identity `json:"identity,omitempty"`
	// Probe makes the helper exit 0 after mounting instead of exec'ing.
	Probe bool `json:"probe,omitempty"`
	// StatusFD is the helper's end of the start-status pipe.
	StatusFD int `json:"statusFD"`
}

// Prepare turns cmd into a helper invocation that execs spec.Path with argv
// in a new mount namespace. cmd.Env and cmd.ExtraFiles may already be set;
// cmd.SysProcAttr gains CLONE_NEWNS. After cmd.Start (directly or through a
// pty helper) the caller must call the returned finish with Start's error:
// it reports why the helper could not exec the program, if it could not,
// and releases the status pipe.
func Prepare(cmd *exec.Cmd, helper string, spec Spec, argv []string) (finish func(startErr error) error, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create status pipe: %w", err)
	}
	spec.StatusFD = 3 + len(cmd.ExtraFiles)
	raw, err := json.Marshal(spec)
	if err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, fmt.Errorf("encode mount spec: %w", err)
	}
	cmd.Path = helper
	cmd.Args = append([]string{helperArg0}, argv...)
	cmd.Env = append(cmd.Env, envSpec+"="+string(raw))
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Unshareflags |= syscall.CLONE_NEWNS
	return func(startErr error) error {
		_ = w.Close()
		defer func() { _ = r.Close() }()
		if startErr != nil {
			return startErr
		}
		// The pipe closes on exec (close-on-exec) or when the helper
		// exits after writing why it failed.
		msg, err := io.ReadAll(r)
		if err != nil {
			return fmt.Errorf("read helper status: %w", err)
		}
		if len(msg) > 0 {
			return &StartError{Msg: string(msg)}
		}
		return nil
	}, nil
}

// StartError is the helper's account of why the program did not start.
type StartError struct{ Msg string }

func (e *StartError) Error() string { return e.Msg }

// Probe checks that this process can create mount namespaces and bind
// mounts by running the helper once against two scratch directories.
func Probe(helper, scratch string) error {
	src, err := os.MkdirTemp(scratch, "probe-src-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(src) }()
	dst, err := os.MkdirTemp(scratch, "probe-dst-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dst) }()
	cmd := &exec.Cmd{Env: []string{}}
	finish, err := Prepare(cmd, helper, Spec{
		Mounts:      []Mount{{Source: src, Target: dst}},
		FallbackDir: scratch,
		Probe:       true,
	}, []string{"probe"})
	if err != nil {
		return err
	}
	if err := finish(cmd.Start()); err != nil {
		if cmd.Process != nil {
			_ = cmd.Wait()
		}
		return fmt.Errorf("probe mount namespace: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("probe mount namespace: %w", err)
	}
	return nil
}

// Main runs the helper and never returns when this process was started as
// one; otherwise it returns at once.
func Main() {
	raw, ok := os.LookupEnv(envSpec)
	if !ok {
		return
	}
	_ = os.Unsetenv(envSpec)
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fail(3, fmt.Errorf("decode mount spec: %w", err))
	}
	err := run(spec, os.Args[1:])
	fail(spec.StatusFD, err)
}

// fail reports err on the status pipe and exits.
func fail(fd int, err error) {
	if err == nil {
		os.Exit(0)
	}
	if _, werr := syscall.Write(fd, []byte(err.Error())); werr != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(exitHelperFailed)
}

var errNoProgram = errors.New("mount helper: no program to run")
