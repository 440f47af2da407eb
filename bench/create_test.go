package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// BenchmarkCreateRetained prints create → 201 p50/p99 through the real
// HTTP edge of the all-in-one with 10, 1,000 and 10,000 retained sessions,
// a fresh all-in-one per level so the levels differ only in what is
// retained. The retained sessions are seeded through the store as the
// services make them (admitted, recorded, ended through SetStatus, so each
// has its reclaim index entry); each iteration is 50 sequential creates
// on one keep-alive connection, each a session whose workload exits at
// once. Beside them: this process's CPU per create (edge, driver,
// supervisor, NATS and the client together; the kernels are processes of
// their own) and the admission alone (Admit + Admitted through the store).
func BenchmarkCreateRetained(b *testing.B) {
	body, _ := json.Marshal(runSession("kind: Telo.Application\nmetadata:\n  name: quick\nx-devkernel:\n  exitAfterMs: 1\n", false))
	var p50s []time.Duration
	var ns []int
	for _, level := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("retained=%d", level), func(b *testing.B) {
			p50, n := createLevel(b, level, body)
			p50s, ns = append(p50s, p50), append(ns, n)
		})
	}
	if len(p50s) == 3 {
		b.Logf("create p50 at 10,000 retained ÷ at 10: %.2f (n=%d and n=%d)", float64(p50s[2])/float64(p50s[0]), ns[2], ns[0])
	}
}

// createsPerIteration is BenchmarkCreateRetained's batch: p99 needs 500
// samples, -benchtime=3x gives 510.
const createsPerIteration = 170

// createLevel times creates with level sessions retained, on an
// all-in-one of its own (stopped when b ends), and returns the p50 and
// the samples it rests on. Each create leaves one more ended session, so
// the level is what is retained when timing starts (510 creates later,
// 10 retained have become 520).
func createLevel(b *testing.B, level int, body []byte) (time.Duration, int) {
	r := startRunner(b, map[string]string{"RUNNER_MAX_SESSIONS": "100000"})
	store := edgeStore(b, r)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	create := func() time.Duration {
		start := time.Now()
		res, err := client.Post(r.url+"/v1/sessions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		d := time.Since(start)
		if res.StatusCode != http.StatusCreated {
			b.Fatalf("create = %d %s", res.StatusCode, data)
		}
		return d
	}
	start := time.Now()
	seedRetained(b, store, level)
	seeded := time.Since(start)
	for range 5 {
		create() // warm the connection and the services
	}
	l, err := store.Ledger(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if l.Total < level {
		b.Fatalf("ledger counts %d retained sessions, want ≥ %d", l.Total, level)
	}
	var lat []time.Duration
	cpu0 := cpuTime()
	for b.Loop() {
		for range createsPerIteration {
			lat = append(lat, create())
		}
	}
	cpu := (cpuTime() - cpu0) / time.Duration(len(lat))
	b.StopTimer()
	admit := make([]time.Duration, 100)
	ctx := context.Background()
	for i := range admit {
		id := contract.NewSessionID()
		t0 := time.Now()
		if err := store.Admit(ctx, id, contract.ModeRun, session.Limits{MaxSessions: 100000}); err != nil {
			b.Fatal(err)
		}
		if err := store.Admitted(ctx, id); err != nil {
			b.Fatal(err)
		}
		admit[i] = time.Since(t0)
	}
	latency(b, fmt.Sprintf("create → 201 with %d retained", l.Total), "", lat, 0.5, 0.95, 0.99)
	latency(b, "admission alone (Admit + Admitted through the store)", "admit-", admit, 0.5, 0.95)
	b.Logf("CPU of this process per create, n=%d creates: %s (runner and client together: the all-in-one runs in this process; the kernels are processes of their own, not counted); seeded in %s",
		len(lat), cpu.Round(time.Microsecond), seeded.Round(time.Millisecond))
	return lat[rank(0.5, len(lat))], len(lat)
}

// edgeStore is a registry store on the all-in-one's NATS with the edge's
// credential.
func edgeStore(tb testing.TB, r runner) *session.Store {
	tb.Helper()
	kp, err := bus.LoadSeed(bus.SeedFile(allinone.CredentialsDir(r.dataDir), bus.RoleEdge))
	if err != nil {
		tb.Fatal(err)
	}
	auth, err := bus.ClientOptions(bus.RoleEdge, kp, nil)
	if err != nil {
		tb.Fatal(err)
	}
	nc, err := nats.Connect(r.natsURL, auth...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	store, err := session.Open(context.Background(), js, 5_000_000)
	if err != nil {
		tb.Fatal(err)
	}
	return store
}

// seedRetained adds n ended sessions: admitted, recorded (as a creation
// does, start requested just now so the supervisor leaves it to the
// queue) and exited.
func seedRetained(tb testing.TB, store *session.Store, n int) {
	tb.Helper()
	if n <= 0 {
		return
	}
	ctx := context.Background()
	lim := session.Limits{MaxSessions: 100000}
	work := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for range 16 {
		wg.Go(func() {
			for range work {
				if err := seedOne(ctx, store, lim); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	for range n {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	if failed != nil {
		tb.Fatal(failed)
	}
}

func seedOne(ctx context.Context, store *session.Store, lim session.Limits) error {
	id := contract.NewSessionID()
	if err := store.Admit(ctx, id, contract.ModeRun, lim); err != nil {
		return err
	}
	now := time.Now().UTC()
	rec := session.Record{ID: id, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStarting},
		Apps: []session.App{{Name: contract.DefaultApp, Entry: "telo.yaml", IO: contract.IOTTY}}, CreatedAt: now, IdleSince: &now, StartRequestedAt: &now}
	if err := store.Create(ctx, rec); err != nil {
		return err
	}
	if err := store.Admitted(ctx, id); err != nil {
		return err
	}
	code := 0
	if _, err := store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusExited, Code: &code}, nil); err != nil {
		return fmt.Errorf("end seeded session %s: %w", id, err)
	}
	return nil
}
