//go:build linux

package chartcheck

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// natsConf renders in and returns the in-chart NATS's configuration file.
func natsConf(t *testing.T, in install) string {
	t.Helper()
	for _, o := range mustRender(t, loadChart(t), in, chartutil.DefaultCapabilities) {
		if o.GetKind() == "ConfigMap" && o.GetName() == in.release+"-nats-config" {
			conf, _, _ := unstructured.NestedString(o.Object, "data", "nats.conf")
			return conf
		}
	}
	t.Fatalf("%s: no NATS ConfigMap", in.name)
	return ""
}

// loadNATSConf parses conf with nats-server's own loader, in the
// environment the StatefulSet gives it: POD_NAME and NKEY_<ROLE> (the
// public keys the Secret holds).
func loadNATSConf(t *testing.T, conf string) *server.Options {
	t.Helper()
	t.Setenv("POD_NAME", "telo-nats-0")
	for _, r := range roles {
		t.Setenv("NKEY_"+strings.ToUpper(strings.ReplaceAll(r, "-", "_")), testCreds[r]["publicKey"])
	}
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server cannot load the chart's config: %v\n%s", err, conf)
	}
	return opts
}

// TestNATSConfig loads the chart's NATS configuration with nats-server's
// parser: one nkey user per role with exactly that role's permissions from
// files/nats-permissions.json, no anonymous or password user, JetStream on
// /data with the configured sync, a cluster route to every node. Then it
// starts a server from that configuration (one node, loopback ports) and
// proves authentication: a role's seed connects, an anonymous client and an
// unknown key are refused, and the subscriber may not publish on
// runner.ctl.>.
func TestNATSConfig(t *testing.T) {
	data, err := os.ReadFile(permsFile)
	if err != nil {
		t.Fatal(err)
	}
	var perms map[string]struct {
		Publish   struct{ Allow []string } `json:"publish"`
		Subscribe struct{ Allow []string } `json:"subscribe"`
	}
	if err := json.Unmarshal(data, &perms); err != nil {
		t.Fatalf("%s: %v", permsFile, err)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for r := range perms {
			if !yield(r) {
				return
			}
		}
	}); !slices.Equal(got, slices.Sorted(slices.Values(roles))) {
		t.Fatalf("%s roles %v, want %v", permsFile, got, roles)
	}

	for _, tc := range []struct {
		in         install
		nodes      int
		syncAlways bool
		interval   time.Duration
	}{
		{installs[0], 3, true, 0},
		{installs[1], 5, false, 10 * time.Second},
	} {
		t.Run(tc.in.name, func(t *testing.T) {
			opts := loadNATSConf(t, natsConf(t, tc.in))
			if opts.ServerName != "telo-nats-0" {
				t.Errorf("server_name %q, want the pod name", opts.ServerName)
			}
			if !opts.JetStream || opts.StoreDir != "/data" {
				t.Errorf("jetstream %v store %q, want on /data", opts.JetStream, opts.StoreDir)
			}
			if opts.SyncAlways != tc.syncAlways || (tc.interval != 0 && opts.SyncInterval != tc.interval) {
				t.Errorf("sync always %v interval %v, want %v %v", opts.SyncAlways, opts.SyncInterval, tc.syncAlways, tc.interval)
			}
			if len(opts.Routes) != tc.nodes || opts.Cluster.Port != 6222 {
				t.Errorf("%d routes on cluster port %d, want %d on 6222", len(opts.Routes), opts.Cluster.Port, tc.nodes)
			}
			if len(opts.Users) != 0 || opts.NoAuthUser != "" || opts.Username != "" || opts.Authorization != "" {
				t.Errorf("users %v, no_auth_user %q: want nkeys only", opts.Users, opts.NoAuthUser)
			}
			if len(opts.Nkeys) != len(roles) {
				t.Fatalf("%d nkey users, want %d", len(opts.Nkeys), len(roles))
			}
			for _, r := range roles {
				i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == testCreds[r]["publicKey"] })
				if i < 0 {
					t.Errorf("no nkey user for %s", r)
					continue
				}
				p := opts.Nkeys[i].Permissions
				if p == nil || p.Publish == nil || p.Subscribe == nil ||
					!reflect.DeepEqual(p.Publish.Allow, perms[r].Publish.Allow) || !reflect.DeepEqual(p.Subscribe.Allow, perms[r].Subscribe.Allow) ||
					len(p.Publish.Deny) > 0 || len(p.Subscribe.Deny) > 0 {
					t.Errorf("%s permissions %+v, want %s's block %+v", r, p, permsFile, perms[r])
				}
			}
		})
	}

	// A server from the default configuration, alone on loopback.
	opts := loadNATSConf(t, natsConf(t, installs[0]))
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.Cluster, opts.Routes = server.ClusterOpts{}, nil
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS from the chart's config did not start")
	}
	url := s.ClientURL()
	seed := func(r string) nats.Option {
		file := filepath.Join(t.TempDir(), r+".nk")
		if err := os.WriteFile(file, []byte(testCreds[r]["seed"]), 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := nats.NkeyOptionFromSeed(file)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for _, r := range roles {
		nc, err := nats.Connect(url, seed(r))
		if err != nil {
			t.Errorf("%s connects with its seed: %v", r, err)
			continue
		}
		nc.Close()
	}
	if nc, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("anonymous connect: %v, want %v", err, nats.ErrAuthorization)
	}
	denied := make(chan error, 4)
	nc, err := nats.Connect(url, seed("subscriber"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("runner.ctl.x", []byte("stop")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-denied:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("subscriber publish on runner.ctl.x: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("subscriber published on runner.ctl.x without a permissions violation")
	}
}
