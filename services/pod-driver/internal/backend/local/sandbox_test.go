package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// hostileSpec is a run session of the hostile test kernel in mode.
func hostileSpec(mode string, env map[string]string) backend.Spec {
	spec := runSpec(manifest("hostile", nil), contract.IOStreams)
	spec.Env = map[string]string{"HOSTILE_MODE": mode}
	for k, v := range env {
		spec.Env[k] = v
	}
	return spec
}

// newHostileBackend is a sandboxed backend running the hostile kernel, its
// work root inside a runner data dir that holds a secret.
func newHostileBackend(t *testing.T, mod func(*Options)) (b *Backend, secret string) {
	t.Helper()
	// Outside /tmp (the sandbox's /tmp is its own): the data dir must be
	// hidden by the sandbox's cover, not by the private /tmp.
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.MkdirTemp(cwd, ".sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(data) })
	secret = filepath.Join(data, "nats", "secret")
	if err := os.MkdirAll(filepath.Dir(secret), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("runner secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	b = newBackend(t, func(o *Options) {
		o.KernelCommand = []string{hostilePath}
		o.WorkRoot = filepath.Join(data, "sessions")
		o.Sandbox.Hide = []string{data}
		if mod != nil {
			mod(o)
		}
	})
	if b.sb == nil || b.sb.err != nil {
		t.Fatalf("sandbox not available on this machine: %v (the kernel must allow user namespaces)", b.sb.err)
	}
	return b, secret
}

// TestSandboxHostileWorkload: a session that attacks the runner's data,
// another session and the host fails at every attempt, and the other
// session runs on untouched.
func TestSandboxHostileWorkload(t *testing.T) {
	b, secret := newHostileBackend(t, nil)
	hostWrites := []string{"/hostile", "/usr/hostile", "/etc/hostile", filepath.Join(filepath.Dir(secret), "hostile")}
	t.Cleanup(func() {
		for _, p := range hostWrites {
			_ = os.Remove(p) // only there if the sandbox failed
		}
	})

	other := hostileSpec("sleep", nil)
	otherRec := newRecorder()
	otherW := start(t, b, other, otherRec)
	otherRec.waitOutput(t, app, contract.TagStdout, "HOSTILE SLEEPING")
	otherFile := filepath.Join(b.root, other.SessionID, homeDirName, "secret-b")
	if err := os.WriteFile(otherFile, []byte("b-secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	otherPGID := sessionPGID(t, b, other.SessionID)

	spec := hostileSpec("probe", map[string]string{
		"HOSTILE_SECRET":     secret,
		"HOSTILE_OTHER_FILE": otherFile,
		"HOSTILE_OTHER_PID":  strconv.Itoa(otherPGID),
	})
	rec := newRecorder()
	w := start(t, b, spec, rec)
	exit := waitDone(t, w)
	out := rec.output(app, contract.TagStdout)
	if !strings.Contains(out, "HOSTILE DONE") {
		t.Fatalf("hostile probe did not finish (exit %+v); stdout %q stderr %q", exit, out, rec.output(app, contract.TagStderr))
	}
	if exit.Err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Errorf("Exit() = %+v, want code 0", exit)
	}
	checks, controls := 0, 0
	for _, line := range lines(out) {
		switch {
		case strings.HasPrefix(line, "CHECK "):
			checks++
			if !strings.Contains(line, " blocked ") {
				t.Errorf("attack succeeded: %s", line)
			}
		case strings.HasPrefix(line, "CONTROL "):
			controls++
			if !strings.HasSuffix(line, " ok") {
				t.Errorf("sandbox too tight: %s", line)
			}
		case strings.HasPrefix(line, "ID "):
			if !strings.HasPrefix(line, "ID uid=1000 gid=1000 pid=") {
				t.Errorf("identity inside = %q, want uid 1000, gid 1000", line)
			}
			// In a fresh PID namespace the pid counts only what was
			// started inside it (the init, the workload, what it forked
			// before printing — 11 was seen on a loaded machine); on the
			// host it would come after this test process's own pid.
			if pid, _ := strconv.Atoi(line[strings.LastIndex(line, "=")+1:]); pid <= 0 || pid >= 100 || pid >= os.Getpid() {
				t.Errorf("pid inside = %d (this test is pid %d), want a fresh PID namespace (small pid)", pid, os.Getpid())
			}
		}
	}
	if checks != 15 || controls != 3 {
		t.Errorf("hostile output has %d CHECK and %d CONTROL lines, want 15 and 3:\n%s", checks, controls, out)
	}

	// The other session, the runner's data and the host are untouched.
	select {
	case <-otherW.Done():
		t.Fatalf("the other session ended: %+v", otherW.Exit())
	default:
	}
	if !groupAlive(otherPGID) {
		t.Errorf("the other session's process group %d is gone", otherPGID)
	}
	if got, err := os.ReadFile(otherFile); err != nil || string(got) != "b-secret" {
		t.Errorf("other session's file = %q, %v; want b-secret", got, err)
	}
	if got, err := os.ReadFile(secret); err != nil || string(got) != "runner secret" {
		t.Errorf("runner's secret = %q, %v; want it untouched", got, err)
	}
	for _, p := range hostWrites {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists on the host after the attack (stat: %v)", p, err)
		}
	}
	if ex := stop(t, otherW); !ex.Stopped {
		t.Errorf("other session Exit() = %+v, want Stopped", ex)
	}
}

// TestSandboxMemoryCeiling: a session allocating past its memory ceiling
// is ended by it and reports a failed app exit.
func TestSandboxMemoryCeiling(t *testing.T) {
	b, _ := newHostileBackend(t, func(o *Options) {
		o.RunCeilings = Ceilings{TTL: time.Minute, MemoryBytes: 64 << 20}
	})
	rec := newRecorder()
	w := start(t, b, hostileSpec("alloc", map[string]string{"HOSTILE_ALLOC_MB": "768"}), rec)
	exit := waitDone(t, w)
	out := rec.output(app, contract.TagStdout)
	if strings.Contains(out, "ALLOC SURVIVED") {
		t.Fatalf("768 MiB allocated under a 64 MiB ceiling: %q", out)
	}
	if exit.Err != nil || exit.Code == nil || *exit.Code == 0 {
		t.Fatalf("Exit() = %+v (code %v), want a failed exit", exit, deref(exit.Code))
	}
	if b.sb.cgroups != nil && *exit.Code != 128+9 {
		t.Errorf("exit code under a cgroup memory ceiling = %d, want 137 (killed by the kernel)", *exit.Code)
	}
	rec.mu.Lock()
	ended := rec.ended
	rec.mu.Unlock()
	if len(ended) != 1 || ended[0].code == nil || *ended[0].code != *exit.Code || ended[0].reason == "" {
		t.Errorf("RunEnded calls = %+v, want one with code %d and a reason", ended, *exit.Code)
	}
}

// TestSandboxRunTimeCeiling: a session that would run forever is ended at
// its run-time ceiling and fails with the time-limit message.
func TestSandboxRunTimeCeiling(t *testing.T) {
	// 3 s: the workload must print before the ceiling ends it, and a
	// sandboxed start of the race-built binary on a loaded machine took
	// more than 1 s.
	const ttl = 3 * time.Second
	b, _ := newHostileBackend(t, func(o *Options) {
		o.RunCeilings = Ceilings{TTL: ttl, MemoryBytes: 100 << 20}
		o.StopGrace = 500 * time.Millisecond
	})
	rec := newRecorder()
	began := time.Now()
	w := start(t, b, hostileSpec("sleep", nil), rec)
	rec.waitOutput(t, app, contract.TagStdout, "HOSTILE SLEEPING")
	exit := waitDone(t, w)
	took := time.Since(began)
	if exit.Err == nil || exit.Err.Error() != "session reached its time limit" || exit.Code != nil || exit.Stopped {
		t.Fatalf("Exit() = %+v, want Err \"session reached its time limit\"", exit)
	}
	if took < ttl || took > ttl+5*time.Second {
		t.Errorf("ended after %v, want about %v", took, ttl)
	}
}

// prebuiltEnv names the directory of test binaries a re-run as an
// unprivileged user uses instead of building them.
const prebuiltEnv = "LOCAL_TEST_PREBUILT"

// TestSandboxUnprivileged re-runs the sandbox tests and a few session
// tests as an unprivileged user (uid 65534): the sandbox then maps the
// runner's own uid and has no cgroups (rlimits only). Run as non-root, the
// whole suite is that already.
func TestSandboxUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("already unprivileged: every test of this package ran without root")
		return
	}
	const uid = 65534
	dir, err := os.MkdirTemp("", "local-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"local.test": self, "devkernel": devkernelPath, "hostile": hostilePath, "workspace-server": workspaceServerPath, "telorunner-sandbox": sandboxInitPath} {
		if src == "" {
			t.Fatalf("%s was not built: %v", name, workspaceServerErr)
		}
		copyExecutable(t, src, filepath.Join(dir, name))
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(work, uid, uid); err != nil {
		t.Fatal(err)
	}
	tests := "^(TestSandboxHostileWorkload|TestSandboxMemoryCeiling|TestSandboxRunTimeCeiling|TestSandboxNice|TestSandboxInit|TestExitCode|TestStreamsRunSession|TestWatchSessionComesUp)$"
	cmd := exec.Command(filepath.Join(dir, "local.test"), "-test.run", tests, "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Dir = work
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + work, "TMPDIR=/tmp", prebuiltEnv + "=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sandbox tests as uid %d: %v\n%s", uid, err, out)
	}
	for _, name := range []string{"TestSandboxHostileWorkload", "TestSandboxMemoryCeiling", "TestSandboxRunTimeCeiling", "TestSandboxNice", "TestSandboxInit", "TestExitCode", "TestStreamsRunSession", "TestWatchSessionComesUp"} {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass as uid %d:\n%s", name, uid, out)
		}
	}
}

func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStaleCgroupsRemoved: the groups of a runner that died (kill -9)
// are removed by the next backend's start; a live runner's stay.
func TestStaleCgroupsRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("cgroups are only used as root")
		return
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	var stale, live []string
	for _, h := range []string{"memory", "pids"} {
		stale = append(stale, filepath.Join(cgroupV1Root, h, "telorunner-"+strconv.Itoa(dead.Process.Pid)+"-7"))
		live = append(live, filepath.Join(cgroupV1Root, h, "telorunner-1-7")) // pid 1 lives
	}
	for _, dir := range append(slices.Clone(stale), live...) {
		if err := os.MkdirAll(filepath.Join(dir, "3"), 0o755); err != nil {
			t.Fatalf("create cgroup: %v", err)
		}
	}
	t.Cleanup(func() { removeCgroups(filepath.Join(live[0], "3"), filepath.Join(live[1], "3"), live[0], live[1]) })
	newHostileBackend(t, nil)
	for _, dir := range stale {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale %s still there (stat: %v)", dir, err)
		}
	}
	for _, dir := range live {
		if _, err := os.Stat(filepath.Join(dir, "3")); err != nil {
			t.Errorf("live runner's %s removed: %v", dir, err)
		}
	}
}

// TestSandboxInit: a sandbox's PID 1 is the init program the backend was
// given: the small telorunner-sandbox by default in these tests (as make
// build installs it), or this test binary itself, which links package
// sandboxinit and so is an init too (the fallback when the small program
// is not installed). Both build a working sandbox.
func TestSandboxInit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for name, init := range map[string]string{"small": sandboxInitPath, "self": self} {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t, func(o *Options) { o.Sandbox.Init = init })
			if b.sb == nil || b.sb.err != nil {
				t.Fatalf("sandbox not available on this machine: %v", b.sb.err)
			}
			spec := runSpec(manifest("web", nil), contract.IOTTY)
			rec := newRecorder()
			w := start(t, b, spec, rec)
			rec.waitOutput(t, app, contract.TagTTY, "devkernel web ready")
			pgid := sessionPGID(t, b, spec.SessionID)
			exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pgid))
			if err != nil {
				t.Fatalf("read the sandbox init's executable: %v", err)
			}
			if exe != init {
				t.Errorf("sandbox PID 1 runs %s, want %s", exe, init)
			}
			// Inside, the kernel is PID 2 or later of its own PID namespace
			// and sees a read-only host tree.
			if err := w.Stdin(app, []byte("hello\n")); err != nil {
				t.Fatalf("Stdin() = %v", err)
			}
			rec.waitOutput(t, app, contract.TagTTY, "echo: hello")
			if exit := stop(t, w); exit.Err != nil {
				t.Errorf("Stop() exit = %+v", exit)
			}
		})
	}
}

// TestInitBeside: the default init is telorunner-sandbox beside the
// runner's executable when it is an executable file there, else the runner
// itself.
func TestInitBeside(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "telorunner")
	beside := filepath.Join(dir, "telorunner-sandbox")
	if got := initBeside(self); got != self {
		t.Errorf("no program beside: initBeside() = %s, want %s", got, self)
	}
	if err := os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := initBeside(self); got != self {
		t.Errorf("a non-executable file beside: initBeside() = %s, want %s", got, self)
	}
	if err := os.Chmod(beside, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := initBeside(self); got != beside {
		t.Errorf("an executable beside: initBeside() = %s, want %s", got, beside)
	}
}

// TestSandboxNice: workload processes run at the sandbox's niceness, so
// the runner's own work comes first on a full machine; 0 leaves them at
// the runner's own.
func TestSandboxNice(t *testing.T) {
	own := ownNice(t)
	for _, tt := range []struct{ nice, want int }{{7, max(7, own)}, {0, own}} {
		t.Run(strconv.Itoa(tt.nice), func(t *testing.T) {
			b := newBackend(t, func(o *Options) {
				o.KernelCommand = []string{script(t, "echo \"nice=$(cut -d' ' -f19 /proc/self/stat)\"\n")}
				o.Sandbox.Nice = tt.nice
			})
			rec := newRecorder()
			w := start(t, b, runSpec(manifest("job", nil), contract.IOStreams), rec)
			if exit := waitDone(t, w); exit.Err != nil || exit.Code == nil || *exit.Code != 0 {
				t.Fatalf("Exit() = %+v", exit)
			}
			want := "nice=" + strconv.Itoa(tt.want)
			rec.waitOutput(t, app, contract.TagStdout, want)
		})
	}
}

// ownNice is this test process's niceness.
func ownNice(t *testing.T) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	n, err := strconv.Atoi(fields[16]) // field 19 overall
	if err != nil {
		t.Fatal(err)
	}
	return n
}
