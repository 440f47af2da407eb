package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one OS process of the system under test: a NATS node or a
// service. It keeps its command line and environment, so a killed process
// restarts exactly as it first started (same ports, same store).
type proc struct {
	name string
	kind string // "nats", "api-edge", "pod-driver", "workspace-proxy", "supervisor"
	argv []string
	env  []string
	log  string // file both output streams append to
	// ready is polled after a start until it returns nil.
	ready func(ctx context.Context) error

	// crashed is called when the process ends without the suite killing it.
	crashed func(p *proc, state string)

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	killing bool // the suite is killing it: its exit is no crash
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running (pid %d)", p.name, p.cmd.Process.Pid)
		}
	}
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n==== chaos: start %s at %s\n", p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: nothing the suite does to its own group
	// reaches the services, and a service's kill -9 reaches only itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		p.mu.Lock()
		killed := p.killing
		p.mu.Unlock()
		close(done)
		if !killed && p.crashed != nil {
			p.crashed(p, cmd.ProcessState.String())
		}
	}()
	p.cmd, p.done, p.killing = cmd, done, false
	return nil
}

// pid is the live process id, 0 when not running.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// kill9 sends SIGKILL and waits until the process is reaped.
func (p *proc) kill9() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.killing = true
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	p.note("kill -9")
}

// note appends a marker line to the process's log.
func (p *proc) note(what string) {
	if f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "==== chaos: %s %s at %s\n", what, p.name, time.Now().UTC().Format(time.RFC3339Nano))
		_ = f.Close()
	}
}

// waitReady polls ready until it passes or ctx ends (a process that dies
// meanwhile is restarted by the crash watcher, see system.crashed).
func (p *proc) waitReady(ctx context.Context) error {
	var last error
	for {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = p.ready(c)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v\n%s", p.name, last, tail(p.log, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tail is the last n lines of a log file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// freePorts reserves n distinct loopback ports: all listeners are open at
// once, so no two are equal, then closed for the processes to bind.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ls := make([]net.Listener, n)
	ports := make([]int, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("reserve port: %v", err)
		}
		ls[i], ports[i] = l, l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// httpOK is a readiness check: GET url answers 200.
func httpOK(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("GET %s = %d", url, resp.StatusCode)
		}
		return nil
	}
}

// system is every process of the runner under test.
type system struct {
	t        *testing.T
	dir      string // the suite's work dir: NATS stores, logs, RUNNER_WORK_DIR
	workDir  string // RUNNER_WORK_DIR shared by both drivers
	natsURLs []string
	nats     []*proc
	services []*proc
	edges    []string     // base URLs of the api-edges
	monitor  []string     // NATS monitoring base URLs
	reported map[int]bool // orphan pids already reported
	bins     binaries
	creds    *credentials
	common   []string // the environment every service and `telorunner provision` share

	mu      sync.Mutex
	crashes []string // processes that ended on their own
	closing bool     // teardown: restart nothing
}

// binaries the suite runs, from the environment the Makefile sets.
type binaries struct {
	dir        string // the repository's bin/
	natsServer string
}

func needBinaries(t *testing.T) binaries {
	t.Helper()
	b := binaries{dir: os.Getenv("TELORUNNER_BIN"), natsServer: os.Getenv("TELORUNNER_NATS_SERVER")}
	var missing []string
	if b.dir == "" {
		missing = append(missing, "TELORUNNER_BIN (the repository's bin/ after `make build`)")
	} else {
		for _, name := range []string{"telorunner", "api-edge", "pod-driver", "supervisor", "workspace-proxy", "devkernel", "workspace-server"} {
			if st, err := os.Stat(filepath.Join(b.dir, name)); err != nil || st.IsDir() {
				missing = append(missing, filepath.Join(b.dir, name)+" (make build)")
			}
		}
	}
	if b.natsServer == "" {
		missing = append(missing, "TELORUNNER_NATS_SERVER (make nats-bin)")
	} else if _, err := os.Stat(b.natsServer); err != nil {
		missing = append(missing, b.natsServer+" (make nats-bin)")
	}
	if len(missing) > 0 {
		t.Fatalf("the chaos suite runs built binaries; run it with `make test-chaos`. Missing: %s", strings.Join(missing, "; "))
	}
	return b
}

// Tunables of the processes under test; recovery deadlines are expressed
// in the owner TTL (RUNNER_OWNER_TTL_MS, its default).
const (
	ownerTTL       = 15 * time.Second
	supervisorTick = 500 * time.Millisecond
	exitTTL        = 5 * time.Second
)

func newSystem(t *testing.T, bins binaries) *system {
	t.Helper()
	dir, err := os.MkdirTemp("", "telorunner-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	s := &system{t: t, dir: dir, workDir: filepath.Join(dir, "work"), reported: map[int]bool{}, bins: bins}
	for _, d := range []string{s.workDir, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// 3 × (client, route, monitor) for NATS, 2 edges, 8 ops listeners.
	ports := freePorts(t, 9+2+8)
	client, route, mon := ports[0:3], ports[3:6], ports[6:9]
	var routes []string
	for _, p := range route {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	s.creds = generateCredentials(t, bins, filepath.Join(dir, "credentials"))
	for i := range 3 {
		name := fmt.Sprintf("nats-%d", i+1)
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(natsConfig(t, s.creds, name, client[i], route[i], mon[i], filepath.Join(dir, name), routes)), 0o644); err != nil {
			t.Fatal(err)
		}
		s.natsURLs = append(s.natsURLs, fmt.Sprintf("nats://127.0.0.1:%d", client[i]))
		monURL := fmt.Sprintf("http://127.0.0.1:%d", mon[i])
		s.monitor = append(s.monitor, monURL)
		s.nats = append(s.nats, &proc{
			name: name, kind: "nats",
			argv:  []string{bins.natsServer, "-c", conf},
			env:   []string{"PATH=" + os.Getenv("PATH")},
			log:   filepath.Join(dir, "logs", name+".log"),
			ready: httpOK(monURL + "/healthz"),
		})
	}
	common := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"RUNNER_NATS_URL=" + strings.Join(s.natsURLs, ","),
		"RUNNER_NATS_REPLICAS=3",
		"RUNNER_OWNER_TTL_MS=" + fmt.Sprint(ownerTTL.Milliseconds()),
		"LOG_LEVEL=info", "LOG_FORMAT=text",
		"RUNNER_WATCH_SESSIONS=true",
		"RUNNER_BASE_IMAGE_CATALOG_ENABLED=false", // local backend: no base images, no Docker Hub
		"RUNNER_WORK_DIR=" + s.workDir,
		"RUNNER_EXIT_TTL_MS=" + fmt.Sprint(exitTTL.Milliseconds()),
		"RUNNER_WATCH_IDLE_SECONDS=3600",
		"RUNNER_WATCH_RELOAD_LIMIT=100000",
		"RUNNER_WORKSPACE_CHECKPOINT_SECONDS=10",
		"RUNNER_SUPERVISOR_TICK_MS=" + fmt.Sprint(supervisorTick.Milliseconds()),
	}
	s.common = common
	ops := ports[11:]
	add := func(kind string, i int, extra ...string) {
		name := fmt.Sprintf("%s-%c", kind, 'a'+i)
		opsAddr := fmt.Sprintf("127.0.0.1:%d", ops[len(s.services)])
		env := append(append([]string{}, common...), "RUNNER_OPS_ADDR="+opsAddr,
			"RUNNER_NATS_NKEY_FILE="+s.creds.seed(roleOf[kind]))
		p := &proc{
			name: name, kind: kind,
			argv:  []string{filepath.Join(bins.dir, kind)},
			env:   append(env, extra...),
			log:   filepath.Join(dir, "logs", name+".log"),
			ready: httpOK("http://" + opsAddr + "/readyz"),
		}
		if kind == "api-edge" {
			base := fmt.Sprintf("http://127.0.0.1:%d", ports[9+i])
			s.edges = append(s.edges, base)
			p.ready = httpOK(base + "/v1/health")
		}
		s.services = append(s.services, p)
	}
	for i := range 2 {
		add("api-edge", i, fmt.Sprintf("PORT=%d", ports[9+i]))
		add("pod-driver", i, "RUNNER_BACKEND=local")
		add("workspace-proxy", i)
		add("supervisor", i)
	}
	for _, p := range s.all() {
		p.crashed = s.crashed
	}
	t.Cleanup(s.teardown)
	return s
}

// all is every process, NATS first.
func (s *system) all() []*proc { return append(append([]*proc{}, s.nats...), s.services...) }

// ofKind is the services of one kind.
func (s *system) ofKind(kind string) []*proc {
	var ps []*proc
	for _, p := range s.services {
		if p.kind == kind {
			ps = append(ps, p)
		}
	}
	return ps
}

// startNATS starts the three nodes at once and waits for each to answer
// and for a JetStream meta leader that all three agree on.
func (s *system) startNATS(ctx context.Context, nodes ...*proc) error {
	for _, p := range nodes {
		if err := p.start(); err != nil {
			return err
		}
	}
	for _, p := range nodes {
		if err := p.waitReady(ctx); err != nil {
			return err
		}
	}
	return s.waitMetaLeader(ctx)
}

func (s *system) waitMetaLeader(ctx context.Context) error {
	var last string
	for {
		leaders := map[string]int{}
		up := 0
		for i, p := range s.nats {
			if p.pid() == 0 {
				continue
			}
			up++
			var jsz struct {
				Meta *struct {
					Leader string `json:"leader"`
				} `json:"meta_cluster"`
			}
			if err := getJSON(ctx, s.monitor[i]+"/jsz", &jsz); err != nil || jsz.Meta == nil || jsz.Meta.Leader == "" {
				last = fmt.Sprintf("%s: no meta leader yet (%v)", p.name, err)
				continue
			}
			leaders[jsz.Meta.Leader]++
		}
		for _, n := range leaders {
			if n == up {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no JetStream meta leader agreed on: %s %v", last, leaders)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startAll starts processes and waits until each is ready.
func startAll(ctx context.Context, ps []*proc) error {
	for _, p := range ps {
		if err := p.start(); err != nil {
			return err
		}
	}
	errs := make(chan error, len(ps))
	for _, p := range ps {
		go func() { errs <- p.waitReady(ctx) }()
	}
	var first error
	for range ps {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// crashed records a process that ended on its own as a finding and
// restarts it a second later, as Kubernetes would (restartPolicy Always).
func (s *system) crashed(p *proc, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.crashes = append(s.crashes, fmt.Sprintf("%s exited on its own (%s); restarted:\n%s", p.name, state, tail(p.log, 4)))
	if s.closing {
		return
	}
	time.AfterFunc(time.Second, func() {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if !closing && p.pid() == 0 {
			_ = p.start()
		}
	})
}

// takeCrashes returns the crashes recorded since the last call.
func (s *system) takeCrashes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.crashes
	s.crashes = nil
	return c
}

// driverPIDs are the live pod-driver processes.
func (s *system) driverPIDs() map[int]string {
	m := map[int]string{}
	for _, p := range s.ofKind("pod-driver") {
		if pid := p.pid(); pid != 0 {
			m[pid] = p.name
		}
	}
	return m
}

// teardown kills every process the suite started, then every process that
// still runs in the work dir (orphaned workloads), and removes the work dir
// unless the suite failed (its logs are kept and named).
func (s *system) teardown() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	for _, p := range s.all() {
		if p.pid() != 0 {
			p.kill9()
		}
	}
	for _, pr := range scanWorkProcs(s.dir) {
		_ = syscall.Kill(pr.pid, syscall.SIGKILL)
	}
	if s.t.Failed() {
		s.t.Logf("chaos: logs and stores kept in %s", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

func getJSON(ctx context.Context, url string, v any) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s = %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
