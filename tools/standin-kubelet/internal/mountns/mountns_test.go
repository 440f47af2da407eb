package mountns

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("mount namespaces need root: run the tests as root")
	}
}

// start runs program through the helper and returns its output.
func start(t *testing.T, spec Spec, argv ...string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := &exec.Cmd{Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out}
	finish, err := Prepare(cmd, self, spec, argv)
	if err != nil {
		t.Fatal(err)
	}
	if err := finish(cmd.Start()); err != nil {
		if cmd.Process != nil {
			_ = cmd.Wait()
		}
		return out.String(), err
	}
	err = cmd.Wait()
	return out.String(), err
}

func TestBindMountsAndWorkingDir(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	vol := filepath.Join(root, "vol")
	ro := filepath.Join(root, "ro")
	for _, d := range []string{vol, ro} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(vol, "hello"), []byte("from volume"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The program lives under the directory the first mount covers.
	bin := filepath.Join(root, "mnt", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(bin, "prog")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat hello; echo; pwd; touch ro/x 2>/dev/null && echo writable || echo read-only\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "mnt")
	out, err := start(t, Spec{
		Mounts: []Mount{
			{Source: ro, Target: filepath.Join(target, "ro"), ReadOnly: true},
			{Source: vol, Target: target},
		},
		Dir:         target,
		FallbackDir: root,
		Path:        script,
	}, "prog")
	if err != nil {
		t.Fatalf("run = %v, output %q", err, out)
	}
	want := "from volume\n" + target + "\nread-only\n"
	if out != want {
		t.Errorf("output = %q, want %q", out, want)
	}
	// The host side is untouched: the mount lived in the child's namespace.
	if _, err := os.Stat(filepath.Join(target, "hello")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host %s/hello: err = %v, want it absent", target, err)
	}
}

func TestFallbackDir(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	out, err := start(t, Spec{Dir: filepath.Join(root, "missing"), FallbackDir: root, Path: "/bin/sh"}, "sh", "-c", "pwd")
	if err != nil {
		t.Fatalf("run = %v, output %q", err, out)
	}
	if got := strings.TrimSpace(out); got != root {
		t.Errorf("pwd = %q, want %q", got, root)
	}
}

func TestStartError(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	_, err := start(t, Spec{
		Mounts:      []Mount{{Source: filepath.Join(root, "missing"), Target: filepath.Join(root, "t")}},
		FallbackDir: root,
		Path:        "/bin/sh",
	}, "sh", "-c", "true")
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "open volume") {
		t.Fatalf("run error = %v, want a StartError about the volume", err)
	}
	_, err = start(t, Spec{FallbackDir: root, Path: filepath.Join(root, "nope")}, "nope")
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "exec") {
		t.Fatalf("run error = %v, want a StartError about exec", err)
	}
}

func TestProbe(t *testing.T) {
	requireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := Probe(self, t.TempDir()); err != nil {
		t.Fatalf("Probe() = %v", err)
	}
}

// statusIDs returns the Uid, Gid and Groups lines of /proc/self/status as
// the program saw them.
const statusIDs = `grep -E '^(Uid|Gid|Groups):' /proc/self/status`

// TestIdentity runs a program as uid 1000 from a directory only root can
// reach: the helper switches identity after mounting, and reaches the
// program and its PATH directory through descriptors.
func TestIdentity(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	// 0700 and root's: uid 1000 cannot search it.
	private, err := os.MkdirTemp("", "private-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(private) })
	bin := filepath.Join(private, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// prog runs its sibling "helper" by name through PATH.
	if err := os.WriteFile(filepath.Join(bin, "prog"), []byte("#!/bin/sh\nexec helper \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "helper"), []byte("#!/bin/sh\n"+statusIDs+"\npwd\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(root, "vol")
	if err := os.Mkdir(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(root, "work")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := &exec.Cmd{Env: []string{"PATH=" + bin + ":/usr/bin:/bin"}, Stdout: &out, Stderr: &out}
	finish, err := Prepare(cmd, self, Spec{
		Mounts:      []Mount{{Source: vol, Target: work}},
		Dir:         work,
		FallbackDir: root,
		Path:        filepath.Join(bin, "prog"),
		Identity:    &identity.Identity{UID: 1000, GID: 1001, Groups: []uint32{2000, 3000}},
	}, []string{"prog"})
	if err != nil {
		t.Fatal(err)
	}
	if err := finish(cmd.Start()); err != nil {
		if cmd.Process != nil {
			_ = cmd.Wait()
		}
		t.Fatalf("start = %v, output %q", err, out.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run = %v, output %q", err, out.String())
	}
	want := "Uid:\t1000\t1000\t1000\t1000\nGid:\t1001\t1001\t1001\t1001\nGroups:\t2000 3000 \n" + work + "\n"
	if got := out.String(); got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
}

// TestIdentityWithoutReach is the control of TestIdentity: a program the
// user cannot reach by any means does not run.
func TestIdentityWithoutReach(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	prog := filepath.Join(root, "prog")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\necho ran\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := start(t, Spec{FallbackDir: root, Path: prog, Identity: &identity.Identity{UID: 1000, GID: 1000}}, "prog")
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "permission denied") {
		t.Fatalf("run = %v, output %q, want a StartError: permission denied", err, out)
	}
}
