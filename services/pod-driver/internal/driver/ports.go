package driver

import (
	"encoding/json"
	"fmt"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// parsePortsResolved reads a Kernel.PortsResolved payload tolerantly
// (10.7): a non-array `ports` is no frame (ok false); entries whose port is
// not an integer in 1–65535 are skipped; protocol is udp only when exactly
// "udp".
func parsePortsResolved(payload json.RawMessage) ([]contract.PortMapping, bool) {
	var pl struct {
		Ports json.RawMessage `json:"ports"`
	}
	if json.Unmarshal(payload, &pl) != nil {
		return nil, false
	}
	var items []map[string]any
	if json.Unmarshal(pl.Ports, &items) != nil {
		return nil, false
	}
	out := make([]contract.PortMapping, 0, len(items))
	seen := map[string]bool{}
	for _, it := range items {
		n, ok := it["port"].(float64)
		if !ok || n != float64(int(n)) || n < 1 || n > 65535 {
			continue
		}
		p := contract.PortMapping{Port: int(n), Protocol: "tcp"}
		if s, _ := it["protocol"].(string); s == "udp" {
			p.Protocol = "udp"
		}
		if !seen[p.Key()] {
			seen[p.Key()] = true
			out = append(out, p)
		}
	}
	return out, true
}

// portChange is the outcome of an app declaring a new port set (11.8).
type portChange struct {
	ports    []contract.PortMapping // the app's new recorded set
	added    []contract.PortMapping
	removed  []contract.PortMapping
	rejected []contract.Rejected
}

func (c portChange) empty() bool {
	return len(c.added) == 0 && len(c.removed) == 0 && len(c.rejected) == 0
}

// diffPorts compares an app's declared set with its recorded one. A port
// another app already declares, the co-resident agent's port, or a port
// the runner listens on (the workspace server, inspectors:
// contract.ReservedPorts) is rejected for this app, never routed.
func diffPorts(rec *session.Record, app string, declared []contract.PortMapping) (portChange, bool) {
	a, ok := rec.App(app)
	if !ok {
		return portChange{}, false
	}
	claimed := map[string]string{}
	for _, other := range rec.Apps {
		if other.Name == app {
			continue
		}
		for _, p := range other.Ports {
			claimed[p.Key()] = other.Name
		}
	}
	agentKey := ""
	if rec.Launch.AgentSpec != nil {
		agentKey = contract.PortMapping{Port: rec.Launch.AgentSpec.Port, Protocol: "tcp"}.Key()
	}
	reserved := contract.ReservedPorts(rec.Mode, rec.Launch.Inspect, len(rec.Apps))
	var c portChange
	want := map[string]bool{}
	for _, p := range declared {
		switch {
		case reserved[p.Port] != "":
			c.rejected = append(c.rejected, contract.Rejected{Port: p.Port, Reason: fmt.Sprintf("port %d is reserved for %s", p.Port, reserved[p.Port])})
		case claimed[p.Key()] != "":
			c.rejected = append(c.rejected, contract.Rejected{Port: p.Port, Reason: fmt.Sprintf("another app in this session already declares %s port %d", p.Protocol, p.Port)})
		case p.Key() == agentKey:
			c.rejected = append(c.rejected, contract.Rejected{Port: p.Port, Reason: fmt.Sprintf("the co-resident agent uses tcp port %d", p.Port)})
		default:
			want[p.Key()] = true
		}
	}
	have := map[string]bool{}
	for _, p := range a.Ports {
		have[p.Key()] = true
		if want[p.Key()] {
			c.ports = append(c.ports, p)
		} else {
			c.removed = append(c.removed, p)
		}
	}
	for _, p := range declared {
		if want[p.Key()] && !have[p.Key()] {
			c.added = append(c.added, p)
			c.ports = append(c.ports, p)
			have[p.Key()] = true
		}
	}
	if c.ports == nil {
		c.ports = []contract.PortMapping{}
	}
	return c, true
}

// portsResolved applies a Kernel.PortsResolved frame of app (11.8): the
// routed set changes in the workload first (Service/Ingress on
// Kubernetes); only then is the recorded set updated (CAS) and an
// `endpoints` event says what changed. A routing failure rejects the
// accepted ports with its error and changes nothing (the reference's
// half-applied set is not reproduced). Calls are serialized per session;
// a frame that arrives while no workload is running (it is starting) is
// applied once it runs.
func (o *owned) portsResolved(app string, payload json.RawMessage) {
	declared, ok := parsePortsResolved(payload)
	if !ok || o.mode != contract.ModeWatch {
		return
	}
	o.mu.Lock()
	w, _ := o.w.(backend.WatchWorkload)
	if w == nil {
		if o.pendingPorts == nil {
			o.pendingPorts = map[string]json.RawMessage{}
		}
		o.pendingPorts[app] = payload // the latest declaration wins
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()

	o.portsMu.Lock()
	defer o.portsMu.Unlock()
	ctx := o.ctx
	rec, _, err := o.store.Get(ctx, o.id)
	if err != nil {
		o.log.Warn("read session for declared ports", "app", app, "err", err)
		return
	}
	change, ok := diffPorts(&rec, app, declared)
	if !ok || change.empty() {
		return
	}
	moved := len(change.added) > 0 || len(change.removed) > 0
	if moved {
		if err := w.SetPorts(ctx, app, change.ports); err != nil {
			// Only removals failing emits nothing: routing and record
			// are both unchanged.
			o.log.Warn("route declared ports", "app", app, "err", err)
			if len(change.added) > 0 {
				ev := contract.Event{Type: contract.EventEndpoints, App: app}
				for _, p := range change.added {
					ev.Rejected = append(ev.Rejected, contract.Rejected{Port: p.Port, Reason: err.Error()})
				}
				o.enqueue(ev)
			}
			return
		}
	}
	if moved {
		_, err = o.store.Update(ctx, o.id, func(r *session.Record) error {
			a, ok := r.App(app)
			if !ok {
				return fmt.Errorf("no app %s", app)
			}
			a.Ports = change.ports
			return nil
		})
		if err != nil {
			o.log.Warn("record declared ports", "app", app, "err", err)
			return
		}
	}
	ev := contract.Event{Type: contract.EventEndpoints, App: app, Rejected: change.rejected}
	if len(change.added) > 0 {
		ev.Added = w.Endpoints(change.added)
	}
	if len(change.removed) > 0 {
		ev.Removed = w.Endpoints(change.removed)
	}
	o.enqueue(ev)
	if len(change.added) > 0 {
		w.WatchPorts(app, change.added)
	}
}

// applyPendingPorts applies the port declarations that arrived while the
// workload was starting.
func (o *owned) applyPendingPorts() {
	o.mu.Lock()
	pending := o.pendingPorts
	o.pendingPorts = nil
	o.mu.Unlock()
	for app, payload := range pending {
		o.portsResolved(app, payload)
	}
}
