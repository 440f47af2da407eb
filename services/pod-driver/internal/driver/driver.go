// Package driver owns sessions: it pulls start and adopt commands from the
// shared work queue, claims a session's owner key, runs its workload on a
// backend, turns what the workload reports into events and io on the bus,
// and answers the session's control subjects while it owns it.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/telorunner/telorunner/pkg/contract"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// Options configure a Driver.
type Options struct {
	ID       string
	NC       *nats.Conn
	Store    *session.Store
	Backend  backend.Backend
	Logger   *slog.Logger
	OwnerTTL time.Duration
	Registry prometheus.Registerer
	// Checkpoints restores watch sessions (resume, app-set change).
	Checkpoints *checkpoint.Store
	// Predecessors are driver identities whose owner keys this driver
	// takes over when it starts, without waiting for them to expire: its
	// own identity in a previous run and drivers that died on this machine
	// (their sessions are recovered as adoptions).
	Predecessors []string
	// OperatorEnv is the env of each RUNNER_APPS entry by name, added at
	// start to agents and operator app sessions (records never hold it).
	OperatorEnv map[string]map[string]string
}

// Driver runs sessions it owns.
type Driver struct {
	o   Options
	log *slog.Logger
	m   metrics

	mu    sync.Mutex
	owned map[string]*owned
	// stopping is set by stopAll: a session taken after it looked is not
	// started (nothing would stop it), see own.
	stopping bool
	wg       sync.WaitGroup
}

// New returns a driver; Run starts it.
func New(o Options) *Driver {
	if o.OwnerTTL <= 0 {
		o.OwnerTTL = 15 * time.Second
	}
	return &Driver{o: o, log: o.Logger.With("driver", o.ID), m: newMetrics(o.Registry), owned: map[string]*owned{}}
}

// Run pulls commands until ctx ends, then stops every owned session and
// waits for them (nothing is left running after a clean exit).
func (d *Driver) Run(ctx context.Context) error {
	cons, err := d.o.Store.DriverConsumer(ctx)
	if err != nil {
		return fmt.Errorf("open consumer %s: %w", bus.ConsumerDrivers, err)
	}
	// Sessions run under their own context so that shutdown can stop them
	// in order after the consumer is closed.
	sessCtx, cancelSessions := context.WithCancel(context.Background())
	defer cancelSessions()
	if n := d.takeOver(ctx, sessCtx, d.o.Predecessors); n > 0 {
		d.log.Info("took over the sessions of dead drivers", "sessions", n)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { d.handle(sessCtx, m) },
		jetstream.PullMaxMessages(16), jetstream.PullHeartbeat(5*time.Second))
	if err != nil {
		return fmt.Errorf("consume commands: %w", err)
	}
	probe, err := d.o.NC.QueueSubscribe(bus.SubjectProbe, bus.QueueDrivers, d.answerProbe)
	if err != nil {
		cc.Stop()
		return fmt.Errorf("subscribe %s: %w", bus.SubjectProbe, err)
	}
	d.log.Info("pod-driver pulling commands")
	<-ctx.Done()
	_ = probe.Drain()
	cc.Drain()
	<-cc.Closed()
	d.stopAll()
	cancelSessions()
	d.wg.Wait()
	return nil
}

// answerProbe answers runner.probe with the backend's setup issues.
func (d *Driver) answerProbe(m *nats.Msg) {
	var reply contract.ProbeReply
	if p, ok := d.o.Backend.(backend.Prober); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		issues, err := p.Probe(ctx)
		cancel()
		reply.Issues = issues
		if err != nil {
			reply.Error = err.Error()
		}
	}
	data, _ := json.Marshal(reply)
	if err := m.Respond(data); err != nil {
		d.log.Warn("answer probe", "err", err)
	}
}

// handle takes one start or adopt command. The command names a session;
// the worker reconciles from the stored record, so a redelivery is
// harmless.
func (d *Driver) handle(ctx context.Context, m jetstream.Msg) {
	id := string(m.Data())
	adopt := m.Subject() == bus.SubjectCmdAdopt
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.own(ctx, command{id: id, adopt: adopt, msg: m})
	}()
}

// stopAll stops every owned workload on a clean shutdown (5.8).
func (d *Driver) stopAll() {
	d.mu.Lock()
	d.stopping = true
	sessions := make([]*owned, 0, len(d.owned))
	for _, o := range d.owned {
		sessions = append(sessions, o)
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, o := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.shutdownStop()
		}()
	}
	wg.Wait()
}

// claim creates the owner key. It reports false when another driver owns
// the session.
func (d *Driver) claim(ctx context.Context, id string) (uint64, bool, error) {
	rev, err := d.o.Store.ClaimOwner(ctx, id, d.o.ID)
	if err == nil {
		return rev, true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, fmt.Errorf("claim %s: %w", id, err)
	}
	return 0, false, nil
}

type metrics struct {
	sessions prometheus.Gauge
	started  prometheus.Counter
	failed   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "runner_driver_sessions", Help: "Sessions owned by this driver."}),
		started:  prometheus.NewCounter(prometheus.CounterOpts{Name: "runner_driver_starts_total", Help: "Workloads started."}),
		failed:   prometheus.NewCounter(prometheus.CounterOpts{Name: "runner_driver_start_failures_total", Help: "Workload starts that failed."}),
	}
	if reg != nil {
		reg.MustRegister(m.sessions, m.started, m.failed)
	}
	return m
}
