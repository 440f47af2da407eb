package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// rpcService starts a runner-ws micro service whose endpoint answers with h.
func rpcService(t *testing.T, nc *nats.Conn, h micro.HandlerFunc) micro.Service {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: bus.ServiceWS, Version: "0.0.1"})
	if err != nil {
		t.Fatalf("add service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := svc.AddEndpoint("ws", h, micro.WithEndpointSubject(bus.WSSubjects)); err != nil {
		t.Fatalf("add endpoint: %v", err)
	}
	if err := nc.Flush(); err != nil { // the subscription is on the server
		t.Fatal(err)
	}
	return svc
}

// TestCallReplyError: an error answered through ReplyError reaches Call as
// the same *contract.Error, and the service's stats count it.
func TestCallReplyError(t *testing.T) {
	s := testkit.StartJetStream(t)
	proxy, _ := testkit.Connect(t, s, bus.RoleProxy)
	edge, _ := testkit.Connect(t, s, bus.RoleEdge)
	want := contract.Errorf("file_not_found", "no file 'a/b.txt'\nin the workspace")
	svc := rpcService(t, proxy, func(req micro.Request) {
		switch bus.Op(req.Subject()) {
		case bus.WSRead:
			_ = bus.ReplyError(req, want)
		case bus.WSTouch:
			_ = bus.ReplyErrorAs(req, errors.New("disk on fire"), "workspace_error")
		case bus.WSApply:
			_ = bus.ReplyError(req, &contract.Error{Code: "invalid_path"})
		case bus.WSFreeze: // answered after the handler returned, as runner-ws does
			go func() { _ = bus.ReplyErrorLater(req, contract.Errorf("workspace_frozen", "frozen"), "workspace_error") }()
		default:
			_ = bus.ReplyFrame(req, map[string]int{"touched": 3}, []byte("raw\nbytes"))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, _, err := bus.Call(ctx, edge, &nats.Msg{Subject: bus.WSSubject("aaaaaaaaaaaa", bus.WSRead)})
	var ce *contract.Error
	if !errors.As(err, &ce) || *ce != *want {
		t.Fatalf("Call error = %#v, want %#v", err, want)
	}
	err = bus.CallJSON(ctx, edge, bus.WSSubject("aaaaaaaaaaaa", bus.WSTouch), map[string]any{"paths": []string{"x"}}, nil)
	if !errors.As(err, &ce) || ce.Code != "workspace_error" || ce.Message != "disk on fire" {
		t.Fatalf("CallJSON error = %#v, want workspace_error: disk on fire", err)
	}
	err = bus.CallJSON(ctx, edge, bus.WSSubject("aaaaaaaaaaaa", bus.WSFreeze), nil, nil)
	if !errors.As(err, &ce) || ce.Code != "workspace_frozen" || ce.Message != "frozen" {
		t.Fatalf("CallJSON error (later) = %#v, want workspace_frozen: frozen", err)
	}
	err = bus.CallJSON(ctx, edge, bus.WSSubject("aaaaaaaaaaaa", bus.WSApply), nil, nil)
	if !errors.As(err, &ce) || ce.Code != "invalid_path" || ce.Message != "" {
		t.Fatalf("CallJSON error (no message) = %#v, want invalid_path with no message", err)
	}
	res, data, err := bus.Call(ctx, edge, &nats.Msg{Subject: bus.WSSubject("aaaaaaaaaaaa", bus.WSTree)})
	if err != nil {
		t.Fatalf("Call success: %v", err)
	}
	var got map[string]int
	if json.Unmarshal(res, &got) != nil || got["touched"] != 3 || string(data) != "raw\nbytes" {
		t.Fatalf("Call success = %s %q", res, data)
	}

	// micro counts a request when its handler returns, which may be just
	// after the reply reached the caller: wait for the fifth.
	var st *micro.EndpointStats
	testkit.Poll(ctx, 5*time.Second, func() bool {
		stats := svc.Stats()
		if len(stats.Endpoints) != 1 {
			t.Fatalf("endpoints: %d", len(stats.Endpoints))
		}
		st = stats.Endpoints[0]
		return st.NumRequests >= 5
	})
	// The later error is not counted: micro takes the stats when the
	// handler returns.
	if st.NumRequests != 5 || st.NumErrors != 3 {
		t.Fatalf("stats: %d requests, %d errors; want 5 and 3", st.NumRequests, st.NumErrors)
	}
	if st.LastError != "invalid_path:invalid_path" {
		t.Fatalf("stats last error = %q", st.LastError)
	}
}

// TestCallOldBodyForm: a replier of an earlier release answers errors in the
// body alone ({"error","message"}, no headers) and success as {"ok":true};
// Call understands both.
func TestCallOldBodyForm(t *testing.T) {
	s := testkit.StartJetStream(t)
	driver, _ := testkit.Connect(t, s, bus.RoleDriver)
	edge, _ := testkit.Connect(t, s, bus.RoleEdge)
	sub, err := driver.Subscribe(bus.CtlSubjects("aaaaaaaaaaaa"), func(m *nats.Msg) {
		switch bus.Op(m.Subject) {
		case bus.CtlStop:
			_ = m.Respond([]byte(`{"ok":true}`))
		case bus.CtlApps:
			_ = m.Respond([]byte(`{"error":"set_apps_failed","message":"no"}`))
		default:
			_ = m.Respond([]byte(`not json`))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := driver.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.CallJSON(ctx, edge, bus.CtlSubject("aaaaaaaaaaaa", bus.CtlStop), nil, nil); err != nil {
		t.Fatalf("old ok: %v", err)
	}
	err = bus.CallJSON(ctx, edge, bus.CtlSubject("aaaaaaaaaaaa", bus.CtlApps), nil, nil)
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Code != "set_apps_failed" || ce.Message != "no" {
		t.Fatalf("old error = %#v", err)
	}
	err = bus.CallJSON(ctx, edge, bus.CtlSubject("aaaaaaaaaaaa", bus.CtlResize), nil, nil)
	if err == nil || errors.As(err, &ce) {
		t.Fatalf("undecodable reply = %#v, want a plain error", err)
	}
	_, _, err = bus.Call(ctx, edge, &nats.Msg{Subject: bus.CtlSubject("bbbbbbbbbbbb", bus.CtlStop)})
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no responder = %v, want nats.ErrNoResponders", err)
	}
}

// TestPublishCommandDeduplicated: publishing the same (command, session,
// attempt) twice keeps one message on the command stream; a new attempt
// queues another.
func TestPublishCommandDeduplicated(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	_, js := testkit.Connect(t, s, bus.RoleEdge)
	_, admin := testkit.Connect(t, s, testkit.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	requested := time.UnixMilli(1_700_000_000_123)
	for range 3 {
		if err := bus.PublishCommand(ctx, js, bus.CmdStart, "aaaaaaaaaaaa", bus.StartAttempt(requested)); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	count := func() uint64 {
		st, err := admin.Stream(ctx, bus.StreamCmd)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if n := count(); n != 1 {
		t.Fatalf("after a retried start: %d messages on %s, want 1", n, bus.StreamCmd)
	}
	msg, err := admin.Stream(ctx, bus.StreamCmd)
	if err != nil {
		t.Fatal(err)
	}
	last, err := msg.GetLastMsgForSubject(ctx, bus.CmdStartSubject("aaaaaaaaaaaa"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := last.Header.Get("Nats-Msg-Id"), "start-aaaaaaaaaaaa-1700000000123"; got != want {
		t.Fatalf("Nats-Msg-Id = %q, want %q", got, want)
	}
	if err := bus.PublishCommand(ctx, js, bus.CmdStart, "aaaaaaaaaaaa", bus.StartAttempt(requested.Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	for _, at := range []time.Time{now, now.Add(time.Second)} { // one owner-TTL window
		if err := bus.PublishCommand(ctx, js, bus.CmdAdopt, "aaaaaaaaaaaa", bus.AdoptAttempt(at, 15*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 3 {
		t.Fatalf("after a new start and a retried adopt: %d messages, want 3", n)
	}
	if err := bus.PublishCommand(ctx, js, "restart", "aaaaaaaaaaaa", "1"); err == nil {
		t.Fatal("an unknown command was published")
	}
}
