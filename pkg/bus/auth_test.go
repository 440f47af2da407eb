package bus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/embednats"
	"github.com/telorunner/telorunner/pkg/testkit"
)

var update = flag.Bool("update", false, "rewrite deploy/helm/telorunner/files/nats-permissions.json from bus.Permissions")

const permissionsFile = "../../deploy/helm/telorunner/files/nats-permissions.json"

func permissionsJSON(t *testing.T) []byte {
	t.Helper()
	all := map[string]bus.Permission{}
	for _, role := range bus.Roles {
		p, err := bus.Permissions(role)
		if err != nil {
			t.Fatal(err)
		}
		all[role] = p
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // ">" as is: NATS config strings know no \u escapes
	enc.SetIndent("", "  ")
	if err := enc.Encode(all); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The chart's permissions file is bus.Permissions, byte for byte
// (go test ./bus -run TestPermissionsFile -update rewrites it).
func TestPermissionsFile(t *testing.T) {
	want := permissionsJSON(t)
	if *update {
		if err := os.WriteFile(permissionsFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(permissionsFile)
	if err != nil {
		t.Fatalf("read %s: %v (run go test ./bus -run TestPermissionsFile -update)", permissionsFile, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from bus.Permissions: run go test ./bus -run TestPermissionsFile -update", permissionsFile)
	}
}

// Each role's block in the file is a NATS server config permissions block:
// the server's own config parser reads it into the permissions the
// embedded server uses.
func TestPermissionsFileIsServerConfig(t *testing.T) {
	var blocks map[string]json.RawMessage
	if err := json.Unmarshal(permissionsJSON(t), &blocks); err != nil {
		t.Fatal(err)
	}
	if len(blocks) != len(bus.Roles) {
		t.Fatalf("file has %d roles, want %v", len(blocks), bus.Roles)
	}
	for _, role := range bus.Roles {
		t.Run(role, func(t *testing.T) {
			conf := filepath.Join(t.TempDir(), "nats.conf")
			body := fmt.Sprintf("authorization {\n  users = [\n    {nkey: %q, permissions: %s}\n  ]\n}\n", "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", blocks[role])
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			opts, err := server.ProcessConfigFile(conf)
			if err != nil {
				t.Fatalf("nats-server rejects the %s block: %v", role, err)
			}
			if len(opts.Nkeys) != 1 {
				t.Fatalf("parsed %d nkey users", len(opts.Nkeys))
			}
			p, _ := bus.Permissions(role)
			want, err := embednats.ServerPermissions(p)
			if err != nil {
				t.Fatal(err)
			}
			got := opts.Nkeys[0].Permissions
			if !reflect.DeepEqual(got.Publish.Allow, want.Publish.Allow) || !reflect.DeepEqual(got.Subscribe.Allow, want.Subscribe.Allow) ||
				!reflect.DeepEqual(got.Response, want.Response) {
				t.Fatalf("parsed %+v %+v %+v, want %+v %+v %+v", got.Publish, got.Subscribe, got.Response, want.Publish, want.Subscribe, want.Response)
			}
		})
	}
}

// asyncErrs collects a connection's asynchronous errors.
type asyncErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

func (a *asyncErrs) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprint(a.errs)
}

func (a *asyncErrs) has(substr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), substr) {
			return true
		}
	}
	return false
}

func connectRecording(t *testing.T, s *testkit.Server, role string) (*nats.Conn, *asyncErrs) {
	t.Helper()
	a := &asyncErrs{}
	nc, err := nats.Connect(s.ClientURL(), append(s.ClientOptions(t, role), nats.ErrorHandler(a.handler))...)
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc, a
}

// Every role is refused a publish and a subscription outside its set, and
// no service role may create or delete a stream.
func TestRoleRefusals(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	cases := []struct{ role, pub, sub string }{
		{bus.RoleEdge, bus.IOSubject("aaaaaaaaaaaa", "app"), bus.CtlSubject("aaaaaaaaaaaa", bus.CtlStop)},
		{bus.RoleDriver, bus.SubjectCmdStart, bus.WSSubject("aaaaaaaaaaaa", bus.WSTree)},
		{bus.RoleSupervisor, bus.SubjectCmdStart, bus.EventsSubject("aaaaaaaaaaaa")},
		{bus.RoleProxy, bus.EventsSubject("aaaaaaaaaaaa"), bus.CtlSubject("aaaaaaaaaaaa", bus.CtlStop)},
		{bus.RoleSubscriber, bus.CtlSubject("aaaaaaaaaaaa", bus.CtlStop), bus.SubjectCtlPrefix + ">"},
		{bus.RoleProvisioner, bus.EventsSubject("aaaaaaaaaaaa"), bus.SubjectEventsPrefix + ">"},
	}
	for _, c := range cases {
		t.Run(c.role, func(t *testing.T) {
			nc, errs := connectRecording(t, s, c.role)
			if err := nc.Publish(c.pub, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := nc.SubscribeSync(c.sub); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 5*time.Second, func() bool {
				return errs.has(`Publish to "`+c.pub+`"`) && errs.has(`Subscription to "`+c.sub+`"`)
			}, "%s: no refusal of publish %s and subscribe %s (got %v)", c.role, c.pub, c.sub, errs)
			// JetStream administration is refused (the request is dropped:
			// a timeout plus an async violation), and the stream survives.
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if err := js.DeleteStream(ctx, bus.StreamEvents); err == nil {
				t.Fatalf("%s deleted %s", c.role, bus.StreamEvents)
			}
			if c.role != bus.RoleProvisioner {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				defer cancel()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ROGUE", Subjects: []string{"rogue.>"}}); err == nil {
					t.Fatalf("%s created a stream", c.role)
				}
			}
			testkit.Eventually(t, 5*time.Second, func() bool {
				return errs.has(`Publish to "$JS.API.STREAM.DELETE.` + bus.StreamEvents)
			}, "%s: DeleteStream not refused by permissions", c.role)
		})
	}
	_, admin := testkit.Connect(t, s, testkit.Admin)
	if _, err := admin.Stream(context.Background(), bus.StreamEvents); err != nil {
		t.Fatalf("%s after the refusals: %v", bus.StreamEvents, err)
	}
	if _, err := admin.Stream(context.Background(), "ROGUE"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("ROGUE stream: %v, want not found", err)
	}
}

// A connection without credentials is refused.
func TestAnonymousRefused(t *testing.T) {
	s := testkit.StartJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous Connect() = %v, want %v", err, nats.ErrAuthorization)
	}
}

// The subscriber role follows runner.evt.<id> and runner.io.<id>.<app>
// live and replays them with a filtered ordered consumer and direct gets.
func TestSubscriberReadsEvents(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	_, writer := testkit.Connect(t, s, bus.RoleDriver)
	nc, js := testkit.Connect(t, s, bus.RoleSubscriber)
	for _, c := range []struct{ stream, subject string }{
		{bus.StreamEvents, bus.EventsSubject("bbbbbbbbbbbb")},
		{bus.StreamIO, bus.IOSubject("bbbbbbbbbbbb", "web")},
	} {
		t.Run(c.stream, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			log := bus.NewLog(writer, c.stream, 1<<20)
			if _, err := log.Append(ctx, c.subject, []byte("one"), nil); err != nil {
				t.Fatal(err)
			}
			live, err := nc.SubscribeSync(c.subject)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = live.Unsubscribe() }()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if _, err := log.Append(ctx, c.subject, []byte("two"), nil); err != nil {
				t.Fatal(err)
			}
			if m, err := live.NextMsg(5 * time.Second); err != nil || string(m.Data) != "two" {
				t.Fatalf("live = %v, %v", m, err)
			}
			r, err := bus.NewLog(js, c.stream, 1<<20).Read(ctx, c.subject, 0)
			if err != nil {
				t.Fatalf("replay as subscriber: %v", err)
			}
			defer r.Close()
			for _, want := range []string{"one", "two"} {
				if e, _, _, err := r.Next(); err != nil || string(e.Data) != want {
					t.Fatalf("replay = %q, %v, want %q", e.Data, err, want)
				}
			}
			st, err := js.Stream(ctx, c.stream)
			if err != nil {
				t.Fatal(err)
			}
			if m, err := st.GetLastMsgForSubject(ctx, c.subject); err != nil || string(m.Data) != "two" {
				t.Fatalf("direct get = %v, %v", m, err)
			}
		})
	}
}

// A start command travels on its session's subject (runner.cmd.start.<id>):
// the edge may queue it, and the supervisor may find it queued (stream info
// and a direct get of that subject), as the services do under their roles.
func TestStartCommandUnderRoles(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const id = "aaaaaaaaaaaa"
	_, edge := testkit.Connect(t, s, bus.RoleEdge)
	if _, err := edge.Publish(ctx, bus.CmdStartSubject(id), []byte(id)); err != nil {
		t.Fatalf("edge: queue the start of %s: %v", id, err)
	}
	_, sup := testkit.Connect(t, s, bus.RoleSupervisor)
	cmds, err := sup.Stream(ctx, bus.StreamCmd)
	if err != nil {
		t.Fatalf("supervisor: open %s: %v", bus.StreamCmd, err)
	}
	m, err := cmds.GetLastMsgForSubject(ctx, bus.CmdStartSubject(id))
	if err != nil {
		t.Fatalf("supervisor: find the queued start of %s: %v", id, err)
	}
	if string(m.Data) != id {
		t.Fatalf("queued start = %q, want %q", m.Data, id)
	}
}
