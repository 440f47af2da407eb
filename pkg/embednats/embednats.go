// Package embednats configures an in-process nats-server for telorunner:
// one nkey user per bus role with that role's subject permissions
// (bus.Permissions), so anonymous connections are refused. The all-in-one
// and testkit use it; a standalone install configures its NATS servers
// from deploy/helm/telorunner/files/nats-permissions.json instead.
package embednats

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Users returns the server's nkey users, one per role in pubs (role →
// public key), each with bus.Permissions(role).
func Users(pubs map[string]string) ([]*server.NkeyUser, error) {
	users := make([]*server.NkeyUser, 0, len(pubs))
	for _, role := range bus.Roles {
		pub, ok := pubs[role]
		if !ok {
			continue
		}
		p, err := bus.Permissions(role)
		if err != nil {
			return nil, err
		}
		sp, err := ServerPermissions(p)
		if err != nil {
			return nil, fmt.Errorf("role %s: %w", role, err)
		}
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: sp})
	}
	return users, nil
}

// ServerPermissions converts a config-file permissions block into the
// server's form.
func ServerPermissions(p bus.Permission) (*server.Permissions, error) {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if r := p.AllowResponses; r != nil {
		d, err := time.ParseDuration(r.Expires)
		if err != nil {
			return nil, fmt.Errorf("allow_responses expires: %w", err)
		}
		sp.Response = &server.ResponsePermission{MaxMsgs: r.Max, Expires: d}
	}
	return sp, nil
}

// Options describe an embedded JetStream server.
type Options struct {
	Name  string // server name ("" = generated)
	Dir   string // JetStream store
	Host  string // "" = 127.0.0.1
	Port  int    // -1 = random
	Users []*server.NkeyUser
	// SyncInterval and SyncAlways are the JetStream fsync policy
	// (RUNNER_NATS_SYNC); zero = the server's default (2 minutes).
	SyncInterval time.Duration
	SyncAlways   bool
}

// Start starts the server and waits until it accepts connections.
func Start(o Options, ready time.Duration) (*server.Server, error) {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	s, err := server.NewServer(&server.Options{
		ServerName: o.Name, Host: o.Host, Port: o.Port,
		JetStream: true, StoreDir: o.Dir, NoLog: true, NoSigs: true,
		Nkeys: o.Users, SyncInterval: o.SyncInterval, SyncAlways: o.SyncAlways,
	})
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(ready) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server not ready within %v", ready)
	}
	return s, nil
}
