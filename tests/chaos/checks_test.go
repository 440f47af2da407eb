package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/telorunner/telorunner/pkg/testkit"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// served reports why a session is not served right now ("" when it is):
// its document says running, its workspace answers (both on the probe's
// edge: one round asks one edge, as a client behind a balancer would), and
// a line typed into each app comes back on that app's io channel.
func (s *session) served(ctx context.Context, probe int) string {
	var doc struct {
		Status struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		} `json:"status"`
	}
	resp, err := doJSON(ctx, "GET", s.edge(probe)+"/v1/sessions/"+s.id, nil)
	switch {
	case err != nil:
		return fmt.Sprintf("GET session: %v", err)
	case resp.Status != 200:
		return fmt.Sprintf("GET session = %d %s", resp.Status, resp.Body)
	}
	if err := json.Unmarshal(resp.Body, &doc); err != nil || doc.Status.Kind != "running" {
		return fmt.Sprintf("status %s %s", doc.Status.Kind, doc.Status.Message)
	}
	if resp, err := doJSON(ctx, "GET", s.edge(probe)+"/v1/sessions/"+s.id+"/workspace", nil); err != nil || resp.Status != 200 {
		return fmt.Sprintf("GET workspace = %d %s %v", resp.Status, resp.Body, err)
	}
	for _, a := range chaosApps {
		c := s.io[a.name]
		// Unique across the run: an echo from an earlier probe proves nothing.
		token := fmt.Sprintf("probe-%d-%s", probeSeq.Add(1), a.name)
		// The client cuts its io sockets on purpose every few seconds:
		// allow a reconnect before calling the channel down.
		deadline := time.Now().Add(3 * time.Second)
		var err error
		testkit.Poll(ctx, time.Until(deadline), func() bool {
			err = c.send([]byte(token + "\n"))
			return err == nil
		})
		if err != nil {
			return fmt.Sprintf("app %s: io: %v", a.name, err)
		}
		if !testkit.Poll(ctx, time.Until(deadline), func() bool { return c.sawOutput("echo: " + token) }) {
			return fmt.Sprintf("app %s: typed %q, no echo within 3s", a.name, token)
		}
	}
	return ""
}

var probeSeq atomic.Int64

// waitServed polls every session until all are served at once; it returns
// the time from since, or the reasons of the sessions still not served.
func waitServed(ctx context.Context, sessions []*session, since time.Time, limit time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithDeadline(ctx, since.Add(limit))
	defer cancel()
	for probe := 0; ; probe++ {
		var not []string
		for _, s := range sessions {
			if why := s.served(ctx, probe); why != "" {
				not = append(not, s.id+": "+why)
			}
		}
		if len(not) == 0 {
			return time.Since(since), nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("%d of %d sessions not served %v after the fault (%s)\n    %s", len(not), len(sessions), limit, not[0], strings.Join(not, "\n    "))
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// checkLog reports what the client recorded since the last check: errors,
// and SSE ids or io seqs received twice or skipped (the readers compare
// each frame with the highest one seen, across resumes, as it arrives).
func (s *session) checkLog() []string {
	var out []string
	s.mu.Lock()
	for _, e := range s.errs.strings() {
		out = append(out, "client: "+e)
	}
	out = append(out, prefixed("SSE duplicate: ", s.dups)...)
	out = append(out, prefixed("SSE gap: ", s.gaps)...)
	if s.maxID == 0 {
		out = append(out, "SSE: no event received at all")
	}
	s.errs, s.dups, s.gaps = nil, nil, nil
	s.mu.Unlock()
	for _, app := range sortedKeys(s.io) {
		c := s.io[app]
		c.mu.Lock()
		for _, e := range c.errs.strings() {
			out = append(out, "io "+app+": "+e)
		}
		out = append(out, prefixed("io "+app+" duplicate: ", c.dups)...)
		out = append(out, prefixed("io "+app+" gap: ", c.gaps)...)
		if c.maxSeq == 0 {
			out = append(out, fmt.Sprintf("io %s: no output received at all", app))
		}
		c.errs, c.dups, c.gaps = nil, nil, nil
		c.mu.Unlock()
	}
	return out
}

func prefixed(p string, xs []string) []string {
	var out []string
	for i, x := range xs {
		if i == 5 {
			out = append(out, fmt.Sprintf("%s… and %d more", p, len(xs)-5))
			break
		}
		out = append(out, p+x)
	}
	return out
}

// checkTree compares the workspace with what the client wrote (the marker
// file is the runner's and only its presence is checked). A difference is
// reported by the first check that sees it.
func (s *session) checkTree(ctx context.Context) []string {
	resp, err := doJSON(ctx, "GET", s.edge(0)+"/v1/sessions/"+s.id+"/workspace", nil)
	if err != nil || resp.Status != 200 {
		return []string{fmt.Sprintf("GET workspace = %d %s %v", resp.Status, resp.Body, err)}
	}
	var tree struct {
		Files []struct{ Path, Hash string } `json:"files"`
	}
	if err := json.Unmarshal(resp.Body, &tree); err != nil {
		return []string{fmt.Sprintf("GET workspace: %v in %s", err, resp.Body)}
	}
	got := map[string]string{}
	for _, f := range tree.Files {
		got[f.Path] = f.Hash
	}
	s.mu.Lock()
	want := map[string]string{}
	for p, c := range s.files {
		sum := sha256.Sum256([]byte(c))
		want[p] = hex.EncodeToString(sum[:])
	}
	for p, h := range s.accepted { // losses an earlier check reported
		if h == "" {
			delete(want, p)
		} else {
			want[p] = h
		}
	}
	s.mu.Unlock()
	var out []string
	defer func() {
		// Report a loss once: the tree as found is the base of the next
		// check, until the client writes the path again.
		s.mu.Lock()
		defer s.mu.Unlock()
		for p, w := range want {
			if got[p] != w {
				s.accepted[p] = got[p]
			}
		}
		for p, h := range got {
			if _, ok := want[p]; !ok {
				s.accepted[p] = h
			}
		}
	}()
	if _, ok := got["telo-workspace.yaml"]; !ok {
		out = append(out, "workspace: the marker telo-workspace.yaml is missing")
	}
	delete(got, "telo-workspace.yaml")
	for _, p := range sortedKeys(want) {
		switch h, ok := got[p]; {
		case !ok:
			out = append(out, "workspace: "+p+" missing (the client wrote it)")
		case h != want[p]:
			out = append(out, "workspace: "+p+" has other content than the client wrote")
		}
	}
	for _, p := range sortedKeys(got) {
		if _, ok := want[p]; !ok {
			out = append(out, "workspace: "+p+" present (the client deleted it or never wrote it)")
		}
	}
	return out
}

// checkGenerations: per app, the started generations are 1..n, each once
// (a break is reported once, by the check after it happened).
func (s *session) checkGenerations() []string {
	var out []string
	for _, a := range chaosApps {
		gens := s.runStarts(a.name)
		for i, g := range gens {
			if g != i+1 {
				s.mu.Lock()
				seen := s.genBroken[a.name]
				s.genBroken[a.name] = true
				s.mu.Unlock()
				if !seen {
					out = append(out, fmt.Sprintf("app %s: run generations started %v, want 1..%d each once", a.name, gens, len(gens)))
				}
				break
			}
		}
		if len(gens) == 0 {
			out = append(out, fmt.Sprintf("app %s: no run started", a.name))
		}
	}
	return out
}

// reloadContinues asks for a reload of every app and waits for each app's
// next generation to start.
func (s *session) reloadContinues(ctx context.Context) []string {
	before := map[string]int{}
	for _, a := range chaosApps {
		before[a.name] = len(s.runStarts(a.name))
	}
	resp, err := doJSON(ctx, "POST", s.edge(1)+"/v1/sessions/"+s.id+"/reload", nil)
	if err != nil || resp.Status != 202 {
		return []string{fmt.Sprintf("POST reload = %d %s %v", resp.Status, resp.Body, err)}
	}
	deadline := time.Now().Add(20 * time.Second)
	var out []string
	for _, a := range chaosApps {
		var gens []int
		if !testkit.Poll(ctx, time.Until(deadline), func() bool {
			gens = s.runStarts(a.name)
			return len(gens) > before[a.name]
		}) {
			out = append(out, fmt.Sprintf("app %s: no run started within 20s of a reload (generations so far %v)", a.name, gens))
		}
	}
	return out
}

// workProc is a process whose cwd or command line is in the suite's dir.
type workProc struct {
	pid, ppid int
	cwd, cmd  string
}

// scanWorkProcs lists every process whose cwd or command line points into
// dir (the suite's own processes included).
func scanWorkProcs(dir string) []workProc {
	ents, _ := os.ReadDir("/proc")
	var out []workProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cmd := strings.TrimSpace(strings.ReplaceAll(string(raw), "\x00", " "))
		if !strings.HasPrefix(cwd, dir) && !strings.Contains(cmd, dir) {
			continue
		}
		out = append(out, workProc{pid: pid, ppid: ppidOf(pid), cwd: cwd, cmd: cmd})
	}
	return out
}

func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …; comm may hold spaces, so cut at the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// sandboxStage1 is the command line of a local sandbox's stage 1 (the
// pod-driver's binary re-exec'd as the parent of one workload process, in
// the workload's directory).
const sandboxStage1 = "telorunner-sandbox"

// driverOf is the live pod-driver a workload process descends from ("" if
// none): a sandboxed workload is the child of its sandbox's stage 1 (the
// driver's binary re-exec'd in new namespaces), itself the driver's child,
// so the chain of parents is walked (a few steps; pid 1 ends it).
func driverOf(p workProc, drivers map[int]string) string {
	pid := p.ppid
	for range 8 {
		if pid <= 1 {
			return ""
		}
		if name := drivers[pid]; name != "" {
			return name
		}
		pid = ppidOf(pid)
	}
	return ""
}

// sessionOf is the session id a workload process belongs to: the first
// element of its path under RUNNER_WORK_DIR.
func sessionOf(workDir string, p workProc) string {
	for _, s := range []string{p.cwd, p.cmd} {
		if i := strings.Index(s, workDir+"/"); i >= 0 {
			rest := s[i+len(workDir)+1:]
			if j := strings.IndexAny(rest, "/ "); j >= 0 {
				rest = rest[:j]
			}
			return rest
		}
	}
	return ""
}

// checkOrphans: every workload process (cwd or command line under the work
// dir, not one of the suite's services) is the child of a live pod-driver
// and belongs to a live session, and each live session runs exactly one
// workspace-server and one kernel per app. An orphan is reported by the
// first check that sees it, and again by the final one.
func (sys *system) checkOrphans(live []*session, final bool) []string {
	ours := map[int]bool{}
	for _, p := range sys.all() {
		if pid := p.pid(); pid != 0 {
			ours[pid] = true
		}
	}
	drivers := sys.driverPIDs()
	liveIDs := map[string]bool{}
	for _, s := range live {
		liveIDs[s.id] = true
	}
	per := map[string][]workProc{}
	var out []string
	for _, p := range scanWorkProcs(sys.dir) {
		if ours[p.pid] {
			continue
		}
		if sys.reported[p.pid] && !final {
			continue // an orphan reported by an earlier check
		}
		id := sessionOf(sys.workDir, p)
		owner := driverOf(p, drivers)
		switch {
		case owner == "":
			sys.reported[p.pid] = true
			out = append(out, fmt.Sprintf("orphan process %d (parent %d; no live pod-driver among its ancestors; session %q): %s", p.pid, p.ppid, id, p.cmd))
		case !liveIDs[id]:
			sys.reported[p.pid] = true
			out = append(out, fmt.Sprintf("process %d of %s belongs to no live session (%q): %s", p.pid, owner, id, p.cmd))
		case p.cmd == sandboxStage1:
			// The sandbox around one workload process: owned and of a
			// live session (checked above), not a workload itself.
		default:
			per[id] = append(per[id], p)
		}
	}
	for _, s := range live {
		ps := per[s.id]
		if len(ps) != 1+len(chaosApps) {
			var cmds []string
			for _, p := range ps {
				cmds = append(cmds, fmt.Sprintf("%d (under %s): %s", p.pid, driverOf(p, drivers), p.cmd))
			}
			out = append(out, fmt.Sprintf("session %s runs %d workload processes, want %d (one workspace-server, one kernel per app): %s",
				s.id, len(ps), 1+len(chaosApps), strings.Join(cmds, "; ")))
		}
	}
	return out
}

// connectJS connects to the cluster as the suite's test-only inspector
// (inspectorUser: it reads every stream and bucket, which no role may).
func (sys *system) connectJS() (*nats.Conn, jetstream.JetStream, error) {
	auth, err := nats.NkeyOptionFromSeed(sys.creds.inspectorSeed)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(strings.Join(sys.natsURLs, ","), nats.Name("chaos-suite"), nats.MaxReconnects(-1), auth)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// checkReplicas: every stream, bucket and object store of the bus runs
// with the replica count the services were given (RUNNER_NATS_REPLICAS=3).
func checkReplicas(ctx context.Context, js jetstream.JetStream, want int) []string {
	var names []string
	for _, c := range bus.StreamConfigs(bus.Limits{}) {
		names = append(names, c.Name)
	}
	for _, c := range bus.BucketConfigs(bus.Limits{}) {
		names = append(names, "KV_"+c.Bucket)
	}
	for _, c := range bus.ObjectConfigs(bus.Limits{}) {
		names = append(names, "OBJ_"+c.Bucket)
	}
	var out []string
	for _, n := range names {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := js.Stream(c, n)
		cancel()
		if err != nil {
			out = append(out, fmt.Sprintf("stream %s: %v", n, err))
			continue
		}
		if r := st.CachedInfo().Config.Replicas; r != want {
			out = append(out, fmt.Sprintf("stream %s has %d replica(s), want %d (RUNNER_NATS_REPLICAS=%d)", n, r, want, want))
		}
	}
	return out
}

// leftovers lists what JetStream still holds for a session: event and io
// messages, keys of every bucket, its bundle object.
func leftovers(ctx context.Context, js jetstream.JetStream, id string) []string {
	var out []string
	count := func(stream, subject string) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := js.Stream(c, stream)
		if err != nil {
			out = append(out, fmt.Sprintf("stream %s: %v", stream, err))
			return
		}
		info, err := st.Info(c, jetstream.WithSubjectFilter(subject))
		if err != nil {
			out = append(out, fmt.Sprintf("stream %s: %v", stream, err))
			return
		}
		var n uint64
		for _, k := range info.State.Subjects {
			n += k
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%d message(s) on %s in %s", n, subject, stream))
		}
	}
	count(bus.StreamEvents, bus.EventsSubject(id))
	count(bus.StreamIO, bus.IOSubjects(id))
	for _, b := range bus.BucketConfigs(bus.Limits{}) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err := js.KeyValue(c, b.Bucket)
		if err != nil {
			cancel()
			out = append(out, fmt.Sprintf("bucket %s: %v", b.Bucket, err))
			continue
		}
		keys, err := kv.ListKeysFiltered(c, id, id+".>")
		if err != nil {
			cancel()
			out = append(out, fmt.Sprintf("bucket %s: %v", b.Bucket, err))
			continue
		}
		for k := range keys.Keys() {
			out = append(out, fmt.Sprintf("key %s in bucket %s", k, b.Bucket))
		}
		cancel()
		if b.Bucket == bus.BucketAdmission {
			if e, err := kv.Get(ctx, bus.KeyAdmissionLedger); err == nil && strings.Contains(string(e.Value()), id) {
				out = append(out, fmt.Sprintf("admission ledger still holds %s: %s", id, e.Value()))
			}
			for _, class := range []string{bus.ReclaimEnded, bus.ReclaimSuspended} {
				if _, err := kv.Get(ctx, bus.ReclaimKey(class, id)); err == nil {
					out = append(out, fmt.Sprintf("reclaim index entry %s", bus.ReclaimKey(class, id)))
				}
			}
		}
	}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if obs, err := js.ObjectStore(c, bus.ObjectBundles); err != nil {
		out = append(out, fmt.Sprintf("object store %s: %v", bus.ObjectBundles, err))
	} else if _, err := obs.GetInfo(c, id); err == nil {
		out = append(out, fmt.Sprintf("object %s in %s", id, bus.ObjectBundles))
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		out = append(out, fmt.Sprintf("object store %s: %v", bus.ObjectBundles, err))
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
