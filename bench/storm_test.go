package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// BenchmarkReconnectStorm: 1,000 SSE clients reconnect at once to one
// session with Last-Event-ID = tail - missed and read up to the tail, over
// a retained window of `window` events. Reported per reconnect: p50/p99
// latency, the edge's direct-get round trips and the entries it read from
// the stream, after one untimed storm. A reconnect costs O(missed): the figures do not grow with the
// window. baseline-* is the previous reader in the same run (an ordered
// consumer from the window's start, skipping to lastEventId), on 50
// clients.
func BenchmarkReconnectStorm(b *testing.B) {
	const clients, baselineClients = 1000, 50
	r := startRunner(b, map[string]string{"RUNNER_WATCH_SESSIONS": "true"})
	id := r.create(b, runSession("kind: Telo.Application\nmetadata:\n  name: quiet\n", true))
	kp, err := bus.LoadSeed(bus.SeedFile(allinone.CredentialsDir(r.dataDir), bus.RoleDriver))
	if err != nil {
		b.Fatal(err)
	}
	auth, err := bus.ClientOptions(bus.RoleDriver, kp, nil)
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(r.natsURL, auth...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := session.Open(context.Background(), js, 5_000_000)
	if err != nil {
		b.Fatal(err)
	}
	subject := bus.EventsSubject(id)
	ctx := context.Background()
	settled := func() bool {
		rec, _, err := store.Get(ctx, id)
		return err == nil && rec.Status.Kind == contract.StatusRunning
	}
	if !testkit.Poll(ctx, 30*time.Second, settled) {
		b.Fatal("session did not reach running")
	}
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 0}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	for _, window := range []int{1000, 20000} {
		for {
			tail, err := store.Events().Tail(ctx, subject)
			if err != nil {
				b.Fatal(err)
			}
			if tail >= uint64(window) {
				break
			}
			if _, err := store.Emit(ctx, id, contract.Event{Type: contract.EventProgress, Phase: "boot", Message: fmt.Sprintf("filler-%d", tail)}); err != nil {
				b.Fatal(err)
			}
		}
		tail, err := store.Events().Tail(ctx, subject)
		if err != nil {
			b.Fatal(err)
		}
		for _, missed := range []uint64{1, 10, 100} {
			b.Run(fmt.Sprintf("window=%d/missed=%d", window, missed), func(b *testing.B) {
				url := r.url + "/v1/sessions/" + id + "/events"
				storm(b, client, url, tail-missed, tail, clients) // warm-up, not counted
				var lat []time.Duration
				early := 0
				gets0, ents0 := bus.DirectGets(), bus.RangeEntries()
				for b.Loop() {
					l, e := storm(b, client, url, tail-missed, tail, clients)
					lat, early = append(lat, l...), early+e
				}
				n := float64(len(lat))
				gets, ents := float64(bus.DirectGets()-gets0)/n, float64(bus.RangeEntries()-ents0)/n
				b.ReportMetric(gets, "gets/reconnect")
				b.ReportMetric(ents, "entries/reconnect")
				latency(b, fmt.Sprintf("reconnect to reading id %d", tail), "", lat, 0.5, 0.99)
				b.ReportMetric(float64(early), "ended-early")
				b.Logf("per reconnect, n=%d reconnects: %.2f direct gets, %.2f entries read; streams the edge ended before the tail (reconnected once, in the figures): %d",
					len(lat), gets, ents, early)
				// The previous reader: from the window's start, skipping.
				var base []time.Duration
				var read uint64
				var mu sync.Mutex
				var wg sync.WaitGroup
				for range baselineClients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						t0 := time.Now()
						n := fromWindowStart(b, js, subject, tail)
						mu.Lock()
						base = append(base, time.Since(t0))
						read += n
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(read)/baselineClients, "baseline-entries/reconnect")
				latency(b, "baseline: the previous reader, from the window's start", "baseline-", base, 0.5)
				b.Logf("baseline per reconnect, n=%d: %.0f entries read", baselineClients, float64(read)/baselineClients)
			})
		}
	}
}

// storm connects clients SSE streams at once from lastEventId = after and
// returns each one's time to read the event with id tail, and how many
// streams the edge ended before it. Such a stream (a 200 that ends
// cleanly: the edge's read of the log failed, seen under a loaded
// machine) is reconnected once from the last id it gave, as an
// EventSource would; the time includes the reconnect. A second early end,
// an id out of order or any other error fails b.
func storm(b *testing.B, client *http.Client, url string, after, tail uint64, clients int) ([]time.Duration, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lat := make([]time.Duration, clients)
	errs := make(chan error, clients)
	var early atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			last := after
			for try := range 2 {
				reached, err := readTo(ctx, client, url, &last, tail)
				if reached {
					lat[i] = time.Since(t0)
					return
				}
				if err != nil || try == 1 {
					errs <- fmt.Errorf("client %d, try %d: stream ended at id %d before id %d: %v", i, try+1, last, tail, err)
					return
				}
				early.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return lat, int(early.Load())
}

// readTo reads one SSE stream from Last-Event-ID *last until id tail,
// keeping *last at the last id read; err is nil when the stream ended
// cleanly before tail.
func readTo(ctx context.Context, client *http.Client, url string, last *uint64, tail uint64) (bool, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Last-Event-ID", fmt.Sprint(*last))
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "id: ")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(v, 10, 64)
		if err != nil || id != *last+1 {
			return false, fmt.Errorf("id %q after %d", v, *last)
		}
		*last = id
		if id == tail {
			return true, nil
		}
	}
	return false, sc.Err()
}

// fromWindowStart is the previous reader's cost: an ordered consumer over
// the whole retained window, read up to tail. It returns the entries read.
func fromWindowStart(b *testing.B, js jetstream.JetStream, subject string, tail uint64) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		b.Error(err)
		return 0
	}
	it, err := c.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		b.Error(err)
		return 0
	}
	defer it.Stop()
	var n uint64
	for {
		m, err := it.Next()
		if err != nil {
			b.Error(err)
			return n
		}
		n++
		if m.Headers().Get(bus.HeaderSeq) == fmt.Sprint(tail) {
			return n
		}
	}
}
