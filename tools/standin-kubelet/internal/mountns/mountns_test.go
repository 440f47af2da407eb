package mountns

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
