package allinone

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/embednats"
)

// `telorunner credentials generate` writes a seed per role and prints the
// public keys; `telorunner provision` succeeds with the provisioner seed
// only: anonymous and a service role are refused.
func TestCredentialsAndProvisionCommands(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := GenerateCredentials(dir, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(bus.Roles) {
		t.Fatalf("output %q, want one line per role", out.String())
	}
	pubs := map[string]string{}
	for i, l := range lines {
		role, pub, ok := strings.Cut(l, " ")
		if !ok || role != bus.Roles[i] || !nkeys.IsValidPublicUserKey(pub) {
			t.Fatalf("line %q, want %q <user public key>", l, bus.Roles[i])
		}
		kp, err := bus.LoadSeed(bus.SeedFile(dir, role))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := kp.PublicKey(); got != pub {
			t.Fatalf("%s: printed %s, seed has %s", role, pub, got)
		}
		if b, err := os.ReadFile(filepath.Join(dir, role+".pub")); err != nil || strings.TrimSpace(string(b)) != pub {
			t.Fatalf("%s.pub = %q, %v; want %s", role, b, err, pub)
		}
		pubs[role] = pub
	}
	var again bytes.Buffer
	if err := GenerateCredentials(dir, &again); err != nil || again.String() != out.String() {
		t.Fatalf("second generate = %q, %v; want the same keys", again.String(), err)
	}

	users, err := embednats.Users(pubs)
	if err != nil {
		t.Fatal(err)
	}
	s, err := embednats.Start(embednats.Options{Dir: t.TempDir(), Port: -1, Users: users}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := LoadConfig(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if err := ProvisionBus(ctx, cfg, s.ClientURL(), "", log); err == nil {
		t.Fatal("anonymous provision succeeded")
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if err := ProvisionBus(short, cfg, s.ClientURL(), bus.SeedFile(dir, bus.RoleEdge), log); err == nil {
		t.Fatal("provision as edge succeeded")
	}
	if err := ProvisionBus(ctx, cfg, s.ClientURL(), bus.SeedFile(dir, bus.RoleProvisioner), log); err != nil {
		t.Fatalf("provision as provisioner: %v", err)
	}
}
