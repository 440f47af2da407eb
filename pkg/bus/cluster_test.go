package bus_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// startCluster starts a three-node JetStream cluster in this process (no
// authentication: the roles are not under test here) and returns its
// servers once a meta leader is elected.
func startCluster(t *testing.T) []*server.Server {
	t.Helper()
	ports := make([]int, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var servers []*server.Server
	for i, p := range ports {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: p},
			Routes:  routes,
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers = append(servers, s)
	}
	testkit.Eventually(t, 30*time.Second, func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				return true
			}
		}
		return false
	}, "a JetStream meta leader")
	return servers
}

// Reading a log's tail goes on while the stream elects a new leader: the
// node leading RUNNER_EVENTS dies and Tail still answers (a client that
// reconnects during a failover is served, not answered 500).
func TestTailDuringLeaderFailover(t *testing.T) {
	servers := startCluster(t)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	nc, err := nats.Connect(urls[0]+","+urls[1]+","+urls[2], nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	testkit.Eventually(t, 30*time.Second, func() bool {
		return bus.Provision(ctx, js, bus.Limits{Replicas: 3}) == nil
	}, "provisioning the cluster")
	l := bus.NewLog(js, bus.StreamEvents, 1<<20)
	subject := bus.EventsSubject("aaaaaaaaaaaa")
	for range 5 {
		if _, err := l.Append(ctx, subject, []byte("{}"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if seq, err := l.Tail(ctx, subject); err != nil || seq != 5 {
		t.Fatalf("Tail() = %d, %v; want 5", seq, err)
	}

	var leader *server.Server
	testkit.Eventually(t, 10*time.Second, func() bool {
		for _, s := range servers {
			if s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, bus.StreamEvents) {
				leader = s
				return true
			}
		}
		return false
	}, "a leader for %s", bus.StreamEvents)
	leader.Shutdown()
	start := time.Now()
	seq, err := l.Tail(ctx, subject)
	if err != nil || seq != 5 {
		t.Fatalf("Tail() while %s elects a leader = %d, %v (after %v); want 5", bus.StreamEvents, seq, err, time.Since(start))
	}
	t.Logf("Tail answered %v after the leader died", time.Since(start).Round(time.Millisecond))
}
