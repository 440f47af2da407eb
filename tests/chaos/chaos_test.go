package chaos

import (
	"context"
	"fmt"
	"github.com/telorunner/telorunner/pkg/testkit"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Sizes and deadlines of the run.
const (
	chaosSessions = 3
	deleteAtEnd   = 2 // sessions deleted at the end, then checked gone from JetStream
	// A lost process is replaced by its peer (or its sessions adopted)
	// within 2 × owner TTL (issue 10); 3 × gives slack for a loaded machine.
	recoverLimit = 3 * ownerTTL
	// Everything at once: the NATS cluster elects a meta leader (up to
	// ~7 s), every service starts, every session is recovered.
	recoverAllLimit = 90 * time.Second
)

// fault is one row of the report.
type fault struct {
	name     string
	served   string // time until every session was served again, or why not
	failures []string
}

func TestChaos(t *testing.T) {
	bins := needBinaries(t)
	sys := newSystem(t, bins)
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()

	t0 := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
	if err := sys.startNATS(sctx, sys.nats...); err != nil {
		scancel()
		t.Fatalf("start the NATS cluster: %v", err)
	}
	// As the install's provisioning step: the services wait for the bus.
	err := sys.provision(sctx)
	if err != nil {
		scancel()
		t.Fatalf("provision the bus: %v", err)
	}
	err = startAll(sctx, sys.services)
	scancel()
	if err != nil {
		t.Fatalf("start the services: %v (exits: %v)", err, sys.takeCrashes())
	}
	t.Logf("chaos: 3 NATS nodes and %d services up in %v (work dir %s)", len(sys.services), time.Since(t0).Round(time.Millisecond), sys.dir)

	nc, js, err := sys.connectJS()
	if err != nil {
		t.Fatalf("connect to the cluster: %v", err)
	}
	defer nc.Close()

	var report []fault
	row := func(name string, served string, failures []string) {
		report = append(report, fault{name, served, failures})
		for _, f := range failures {
			t.Errorf("%s: %s", name, f)
		}
	}
	defer func() {
		var b strings.Builder
		fmt.Fprintf(&b, "chaos report (%d watch sessions × %d devkernel apps; owner TTL %v):\n", chaosSessions, len(chaosApps), ownerTTL)
		for _, f := range report {
			verdict := "PASS"
			if len(f.failures) > 0 {
				verdict = fmt.Sprintf("FAIL (%d findings)", len(f.failures))
			}
			fmt.Fprintf(&b, "  %s — %s; served again: %s\n", f.name, verdict, f.served)
			for i, x := range f.failures {
				if i == 3 {
					fmt.Fprintf(&b, "      … %d more above\n", len(f.failures)-3)
					break
				}
				fmt.Fprintf(&b, "      %s\n", firstLine(x))
			}
		}
		t.Log(b.String())
	}()

	row("replicas (RUNNER_NATS_REPLICAS=3)", "-", checkReplicas(ctx, js, 3))

	// The editor: sessions, each with its readers and its editing loop.
	cctx, ccancel := context.WithCancel(ctx)
	ed := &editor{ctx: cctx, edges: sys.edges}
	defer func() { ccancel(); ed.wg.Wait() }()
	var sessions []*session
	for i := range chaosSessions {
		s, err := ed.open(ctx)
		if err != nil {
			t.Fatalf("create session %d: %v", i, err)
		}
		sessions = append(sessions, s)
	}
	created := time.Now()
	d, err := waitServed(ctx, sessions, created, 90*time.Second)
	if err != nil {
		row("start-up", "never", append(sys.takeCrashes(), err.Error()))
		t.FailNow()
	}
	row("start-up (create → served)", d.Round(time.Millisecond).String(), append(sys.takeCrashes(), sys.check(ctx, sessions)...))

	live := append([]*session{}, sessions...)
	one := func(kind string) func() []*proc {
		return func() []*proc { return sys.ofKind(kind)[:1] }
	}
	for _, f := range []struct {
		name   string
		victim func() []*proc
		limit  time.Duration
	}{
		{"kill -9 one api-edge", one("api-edge"), recoverLimit},
		{"kill -9 the busiest pod-driver", sys.busiestDriver, recoverLimit},
		{"kill -9 one workspace-proxy", one("workspace-proxy"), recoverLimit},
		{"kill -9 the active supervisor", func() []*proc { return sys.activeSupervisor(ctx, js) }, recoverLimit},
		{"kill -9 the NATS node leading " + bus.StreamEvents, func() []*proc { return sys.streamLeader(ctx, js) }, recoverLimit},
		{"kill -9 everything, restart everything", sys.all, recoverAllLimit},
	} {
		t.Run(strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
			victims := f.victim()
			var names []string
			for _, p := range victims {
				names = append(names, p.name)
			}
			t.Logf("chaos: %s: %s", f.name, strings.Join(names, ", "))
			served, failures := sys.inject(ctx, victims, live, f.limit)
			failures = append(failures, sys.check(ctx, live)...)
			// Any process that ended on its own meanwhile is a finding too.
			failures = append(failures, sys.takeCrashes()...)
			for _, x := range failures {
				t.Error(x)
			}
			// A session the fault lost is replaced, so the next fault is
			// judged on its own.
			for i, s := range live {
				if why := lost(ctx, s); why != "" {
					s.stop()
					ns, err := ed.open(ctx)
					if err == nil {
						_, err = waitServed(ctx, []*session{ns}, time.Now(), 90*time.Second)
					}
					if err != nil {
						t.Fatalf("replace lost session %s: %v", s.id, err)
					}
					t.Logf("chaos: session %s lost (%s): replaced by %s", s.id, why, ns.id)
					live[i] = ns
				}
			}
			report = append(report, fault{f.name + " (" + strings.Join(names, ",") + ")", served, failures})
		})
	}

	// Delete some sessions; everything of theirs leaves JetStream and the
	// machine, and the rest is still served.
	t.Run("delete_sessions", func(t *testing.T) {
		gone, kept := live[:deleteAtEnd], live[deleteAtEnd:]
		var failures []string
		for i, s := range gone {
			// The probe below must be able to see a session's data at all.
			if len(leftovers(ctx, js, s.id)) == 0 {
				failures = append(failures, fmt.Sprintf("session %s: nothing found in JetStream while it lives: the leftover probe is blind", s.id))
			}
			s.quiesce(ctx)
			s.mu.Lock()
			s.deleted = true
			s.mu.Unlock()
			resp, err := doJSON(ctx, "DELETE", s.edge(i)+"/v1/sessions/"+s.id, nil)
			if err != nil || resp.Status/100 != 2 {
				failures = append(failures, fmt.Sprintf("DELETE %s = %d %s %v", s.id, resp.Status, resp.Body, err))
			}
		}
		// Ended sessions stay readable for RUNNER_EXIT_TTL_MS, then go.
		deadline := time.Now().Add(exitTTL + 30*time.Second)
		for _, s := range gone {
			var left []string
			testkit.Poll(ctx, time.Until(deadline), func() bool {
				left = leftovers(ctx, js, s.id)
				return len(left) == 0
			})
			for _, l := range left {
				failures = append(failures, fmt.Sprintf("deleted session %s still in JetStream %v after its exit TTL: %s", s.id, exitTTL+30*time.Second, l))
			}
			s.mu.Lock()
			if s.terminal == "" {
				failures = append(failures, fmt.Sprintf("deleted session %s: no terminal status on its event stream", s.id))
			}
			s.mu.Unlock()
		}
		failures = append(failures, sys.checkOrphans(kept, true)...)
		failures = append(failures, sys.takeCrashes()...)
		if _, err := waitServed(ctx, kept, time.Now(), 20*time.Second); err != nil {
			failures = append(failures, "the remaining sessions: "+err.Error())
		}
		for _, x := range failures {
			t.Error(x)
		}
		report = append(report, fault{fmt.Sprintf("delete %d sessions", len(gone)), "-", failures})
	})
}

// inject kills victims, waits until every session is served with them
// down, restarts them and waits for them to be ready (and for the
// sessions to be served again when they were not before).
func (sys *system) inject(ctx context.Context, victims []*proc, live []*session, limit time.Duration) (served string, failures []string) {
	start := time.Now()
	var natsDown []*proc
	for _, p := range victims {
		p.kill9()
		if p.kind == "nats" {
			natsDown = append(natsDown, p)
		}
	}
	restart := func() {
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if len(natsDown) > 0 {
			if err := sys.startNATS(rctx, natsDown...); err != nil {
				failures = append(failures, "restart NATS: "+err.Error())
			}
		}
		var svc []*proc
		for _, p := range victims {
			if p.kind != "nats" {
				svc = append(svc, p)
			}
		}
		if err := startAll(rctx, svc); err != nil {
			failures = append(failures, "restart: "+err.Error())
		}
	}
	if len(victims) == len(sys.all()) {
		// Nothing is left to serve: restart at once.
		restart()
		d, err := waitServed(ctx, live, start, limit)
		if err != nil {
			return "never (" + limit.String() + ")", append(failures, err.Error())
		}
		return d.Round(time.Millisecond).String() + " after the kill", failures
	}
	d, err := waitServed(ctx, live, start, limit)
	if err == nil {
		served = d.Round(time.Millisecond).String() + " with it down"
	} else {
		failures = append(failures, "with it down: "+err.Error())
	}
	restart()
	if err != nil {
		again := time.Now()
		if d, err := waitServed(ctx, live, again, limit); err != nil {
			failures = append(failures, "after its restart: "+err.Error())
			served = "never"
		} else {
			served = fmt.Sprintf("not with it down; %v after its restart", d.Round(time.Millisecond))
		}
	}
	return served, failures
}

// check pauses the editors, confirms every change in flight, and checks
// each session, then the machine; the editors resume.
func (sys *system) check(ctx context.Context, live []*session) []string {
	var wg sync.WaitGroup
	for _, s := range live {
		wg.Go(func() { s.quiesce(ctx) })
	}
	wg.Wait()
	defer func() {
		for _, s := range live {
			s.unquiesce()
		}
	}()
	var out []string
	var mu sync.Mutex
	for _, s := range live {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			var f []string
			if !s.gone() {
				if err := s.settle(sctx); err != nil {
					f = append(f, err.Error())
				}
				f = append(f, s.reloadContinues(sctx)...)
				f = append(f, s.checkTree(sctx)...)
				f = append(f, s.checkGenerations()...)
			}
			f = append(f, s.checkLog()...)
			mu.Lock()
			for _, x := range f {
				out = append(out, "session "+s.id+": "+x)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return append(out, sys.checkOrphans(live, false)...)
}

// lost says why a session cannot be used for the next fault ("" when it
// can): the runner ended it, forgot it, or does not serve it for 15 s.
func lost(ctx context.Context, s *session) string {
	if s.gone() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.terminal != "" {
			return "ended: " + s.terminal
		}
		return "not found"
	}
	if _, err := waitServed(ctx, []*session{s}, time.Now(), 15*time.Second); err != nil {
		return err.Error()
	}
	return ""
}

// busiestDriver is the pod-driver the most workload processes descend from.
func (sys *system) busiestDriver() []*proc {
	counts := map[string]int{}
	live := sys.driverPIDs()
	for _, p := range scanWorkProcs(sys.workDir) {
		counts[driverOf(p, live)]++
	}
	drivers := sys.ofKind("pod-driver")
	best := drivers[0]
	for _, d := range drivers {
		if counts[d.name] > counts[best.name] {
			best = d
		}
	}
	return []*proc{best}
}

// activeSupervisor is the supervisor holding the leader key (its id is in
// the key's value and on every line it logs), else the first one.
func (sys *system) activeSupervisor(ctx context.Context, js jetstream.JetStream) []*proc {
	sups := sys.ofKind("supervisor")
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(c, bus.BucketOwners)
	if err != nil {
		return sups[:1]
	}
	e, err := kv.Get(c, bus.KeyLeader)
	if err != nil {
		return sups[:1]
	}
	for _, p := range sups {
		if b, err := os.ReadFile(p.log); err == nil && strings.Contains(string(b), "supervisor="+string(e.Value())) {
			return []*proc{p}
		}
	}
	return sups[:1]
}

// streamLeader is the NATS node leading the events stream (the hardest
// node to lose: appends stall until a new leader is elected).
func (sys *system) streamLeader(ctx context.Context, js jetstream.JetStream) []*proc {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if st, err := js.Stream(c, bus.StreamEvents); err == nil {
		if info, err := st.Info(c); err == nil && info.Cluster != nil {
			for _, p := range sys.nats {
				if p.name == info.Cluster.Leader {
					return []*proc{p}
				}
			}
		}
	}
	return sys.nats[:1]
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
