package proc

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

func TestMain(m *testing.M) {
	mountns.Main()
	goleak.VerifyTestMain(m)
}

type syncBuffer = testutil.SyncBuffer

func sh(t *testing.T, script string, mod func(*Spec)) *Process {
	t.Helper()
	spec := Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: t.TempDir()}
	if mod != nil {
		mod(&spec)
	}
	p, err := Start(spec)
	if err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		p.Exit()
	})
	return p
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, what, 10*time.Second, cond)
}

func TestPipesExitCode(t *testing.T) {
	p := sh(t, `read l; echo "out:$l"; echo "err:$l" >&2; exit 3`, func(s *Spec) { s.Stdin = true })
	var out, errb syncBuffer
	err := p.Attach(context.Background(), strings.NewReader("x\n"), &out, &errb, nil)
	if err != nil {
		t.Fatalf("Attach() = %v", err)
	}
	if got, want := out.String(), "out:x\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := errb.String(), "err:x\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	if got := p.Exit(); got.Code != 3 || got.Signal != 0 {
		t.Errorf("Exit() = %+v, want code 3", got)
	}
}

func TestTTY(t *testing.T) {
	p := sh(t, `read l; if [ -t 0 ] && [ -t 1 ]; then echo "tty:$l"; else echo "notty:$l"; fi; stty size`, func(s *Spec) {
		s.TTY, s.Stdin = true, true
	})
	inR, inW := io.Pipe()
	var out syncBuffer
	sizes := make(chan Size)
	res := make(chan error, 1)
	go func() { res <- p.Attach(context.Background(), inR, &out, nil, sizes) }()
	// The second send returns only once the first size was applied.
	for range 2 {
		sizes <- Size{Width: 100, Height: 40}
	}
	if _, err := inW.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("Attach() = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Attach() did not return after the process exited")
	}
	for _, want := range []string{"tty:ping", "40 100"} {
		if got := out.String(); !strings.Contains(got, want) {
			t.Errorf("terminal output = %q, want it to contain %q", got, want)
		}
	}
	if got := p.Exit(); got.Code != 0 {
		t.Errorf("Exit() = %+v, want code 0", got)
	}
}

func TestSignalAndGroup(t *testing.T) {
	// The shell's child ignores nothing: a TERM to the group ends both.
	p := sh(t, `sleep 30 & wait`, nil)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("process group did not end after SIGTERM")
	}
	if got := p.Exit(); got.Code != 128+int(syscall.SIGTERM) || got.Signal != syscall.SIGTERM {
		t.Errorf("Exit() = %+v, want 143 by SIGTERM", got)
	}
}

func TestDescendantsDoNotOutliveMain(t *testing.T) {
	start := time.Now()
	// The background child keeps stdout open; the main process exits.
	p := sh(t, `(sleep 30; echo late) & exit 0`, nil)
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed while a descendant held stdout")
	}
	if d := time.Since(start); d > drainTimeout {
		t.Errorf("Done after %v, want the group killed well before %v", d, drainTimeout)
	}
}

func TestNoReplayAndSeveralSessions(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "printed")
	p := sh(t, `echo early; touch "$M"; read l; echo "late:$l"`, func(s *Spec) {
		s.Stdin = true
		s.Env = append(s.Env, "M="+marker)
	})
	waitFor(t, "the early line", func() bool { _, err := os.Stat(marker); return err == nil })

	var a, b syncBuffer
	inR, inW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = p.Attach(ctx, inR, &a, io.Discard, nil) })
	wg.Go(func() { errs[1] = p.Attach(ctx, nil, &b, io.Discard, nil) })
	// Both sessions must be subscribed before the process answers.
	waitFor(t, "two subscribers", func() bool {
		p.stdout.mu.Lock()
		defer p.stdout.mu.Unlock()
		return len(p.stdout.subs) == 2
	})
	if _, err := inW.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Attach() #%d = %v", i, err)
		}
	}
	for name, got := range map[string]string{"a": a.String(), "b": b.String()} {
		if got != "late:go\n" {
			t.Errorf("session %s saw %q, want only %q", name, got, "late:go\n")
		}
	}
}

func TestStdinOnce(t *testing.T) {
	p := sh(t, `cat; echo END`, func(s *Spec) { s.Stdin, s.StdinOnce = true, true })
	var out syncBuffer
	if err := p.Attach(context.Background(), strings.NewReader("abc"), &out, io.Discard, nil); err != nil {
		t.Fatalf("Attach() = %v", err)
	}
	if got, want := out.String(), "abcEND\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
}

func TestStdinStaysOpenBetweenSessions(t *testing.T) {
	p := sh(t, `while read l; do echo "got:$l"; done`, func(s *Spec) { s.Stdin = true })
	for _, word := range []string{"one", "two"} {
		inR, inW := io.Pipe()
		var out syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- p.Attach(ctx, inR, &out, io.Discard, nil) }()
		if _, err := inW.Write([]byte(word + "\n")); err != nil {
			t.Fatal(err)
		}
		_ = inW.Close() // the session's input ends; stdin of the process must not
		waitFor(t, "the echo of "+word, func() bool { return strings.Contains(out.String(), "got:"+word) })
		cancel()
		if err := <-res; err != nil {
			t.Errorf("Attach() = %v", err)
		}
	}
	select {
	case <-p.Done():
		t.Fatal("process ended when a session's input ended, want stdin kept open")
	default:
	}
}

func TestAttachAfterExit(t *testing.T) {
	p := sh(t, `exit 0`, nil)
	<-p.Done()
	if err := p.Attach(context.Background(), nil, io.Discard, io.Discard, nil); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Attach() after exit = %v, want %v", err, ErrNotRunning)
	}
}

func TestStartError(t *testing.T) {
	_, err := Start(Spec{Path: "/nonexistent/prog", Argv: []string{"prog"}, Dir: t.TempDir()})
	if err == nil {
		t.Fatal("Start() of a missing program error = nil")
	}
}

func TestMountNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mount namespaces need root: run the tests as root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	vol := filepath.Join(root, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "workspace")
	p := sh(t, `echo hi > file; pwd`, func(s *Spec) {
		s.Helper = self
		s.Mount = &mountns.Spec{Mounts: []mountns.Mount{{Source: vol, Target: target}}, Dir: target, FallbackDir: root, Path: s.Path}
		s.Stdin = true
	})
	var out syncBuffer
	if err := p.Attach(context.Background(), nil, &out, io.Discard, nil); err != nil && !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Attach() = %v", err)
	}
	if got := p.Exit(); got.Code != 0 {
		t.Fatalf("Exit() = %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "file")); err != nil || string(b) != "hi\n" {
		t.Errorf("volume file = %q, %v, want %q", b, err, "hi\n")
	}
}

// TestTTYIdentity runs a program as uid 1000 with a pty, without the mount
// helper (SysProcAttr.Credential): it has the identity's ids and owns its
// terminal, so it can open it by name as a login shell can.
func TestTTYIdentity(t *testing.T) {
	p := sh(t, `read l; echo "ids:$(id -u):$(id -g):$(id -G)"; if echo x > "$(tty)"; then echo "tty:own"; else echo "tty:denied"; fi`, func(s *Spec) {
		s.TTY, s.Stdin, s.Dir = true, true, "/"
		s.Identity = &identity.Identity{UID: 1000, GID: 1001, Groups: []uint32{2000, 3000}}
	})
	inR, inW := io.Pipe()
	var out syncBuffer
	res := make(chan error, 1)
	go func() { res <- p.Attach(context.Background(), inR, &out, nil, nil) }()
	if _, err := inW.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("Attach() = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Attach() did not return after the process exited")
	}
	for _, want := range []string{"ids:1000:1001:1001 2000 3000", "tty:own"} {
		if got := out.String(); !strings.Contains(got, want) {
			t.Errorf("terminal output = %q, want it to contain %q", got, want)
		}
	}
}
