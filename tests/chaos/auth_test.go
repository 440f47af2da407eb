package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// The bus is authenticated as in a production install (README, "Bus
// credentials"): `telorunner credentials generate` writes one nkey seed per
// role, every NATS node admits exactly those nkey users, each with its
// role's block of the chart's nats-permissions.json (nothing anonymous),
// `telorunner provision` creates the streams and buckets as the
// provisioner, and every service connects with its own role's seed.

// permissionsFile is the chart's role → NATS permissions block file, the
// one source of truth the chart's NATS config is built from.
const permissionsFile = "../../deploy/helm/telorunner/files/nats-permissions.json"

// roleOf is the bus role each service kind connects as.
var roleOf = map[string]string{
	"api-edge":        "edge",
	"pod-driver":      "driver",
	"supervisor":      "supervisor",
	"workspace-proxy": "workspace-proxy",
}

// inspectorUser names the suite's own NATS user: TEST-ONLY. It is not a bus
// role and no install has it; it exists because the suite's checks read
// every stream, bucket and object store (leftovers, replicas, the
// supervisor's leader key), which no single role may.
const inspectorUser = "chaos-test-only-inspector"

// credentials are the seed files and public keys of every role.
type credentials struct {
	dir  string
	pubs map[string]string // role → public key, as the command printed it
	// inspectorPub and inspectorSeed are the test-only inspector's nkey.
	inspectorPub  string
	inspectorSeed string
}

// seed is the seed file of a role.
func (c *credentials) seed(role string) string { return filepath.Join(c.dir, role+".nk") }

// generateCredentials runs `telorunner credentials generate <dir>` and reads
// its "<role> <public key>" lines, then makes the test-only inspector's nkey.
func generateCredentials(t *testing.T, bins binaries, dir string) *credentials {
	t.Helper()
	c := &credentials{dir: dir, pubs: map[string]string{}}
	cmd := exec.Command(filepath.Join(bins.dir, "telorunner"), "credentials", "generate", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("telorunner credentials generate %s: %v\n%s", dir, err, stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("telorunner credentials generate: unexpected line %q", line)
		}
		c.pubs[f[0]] = f[1]
	}
	for _, role := range append(mapValues(roleOf), "provisioner") {
		if c.pubs[role] == "" {
			t.Fatalf("telorunner credentials generate printed no key for role %s: %s", role, out)
		}
		if _, err := os.Stat(c.seed(role)); err != nil {
			t.Fatalf("telorunner credentials generate wrote no seed for role %s: %v", role, err)
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	c.inspectorPub = pub
	c.inspectorSeed = filepath.Join(dir, inspectorUser+".nk")
	if err := os.WriteFile(c.inspectorSeed, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// natsConfig is one node's nats-server configuration: client, monitoring
// and route listeners, JetStream store, the cluster's routes, and one nkey
// user per role printed by `credentials generate` with its permissions
// block from the chart's file, plus the test-only inspector (no
// permissions block: everything).
func natsConfig(t *testing.T, c *credentials, name string, client, route, monitor int, store string, routes []string) string {
	t.Helper()
	raw, err := os.ReadFile(permissionsFile)
	if err != nil {
		t.Fatalf("read the role permissions: %v", err)
	}
	var perms map[string]json.RawMessage
	if err := json.Unmarshal(raw, &perms); err != nil {
		t.Fatalf("%s: %v", permissionsFile, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n", name, client, monitor)
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n}\n", store)
	fmt.Fprintf(&b, "cluster {\n  name: chaos\n  listen: \"127.0.0.1:%d\"\n  routes: [\n", route)
	for _, r := range routes {
		fmt.Fprintf(&b, "    %q\n", r)
	}
	b.WriteString("  ]\n}\nauthorization {\n  users: [\n")
	for role, pub := range c.pubs {
		p, ok := perms[role]
		if !ok {
			t.Fatalf("%s has no permissions for role %s", permissionsFile, role)
		}
		// The block as JSON (a NATS config accepts it), with > and <
		// written as themselves: the config has no \u escapes.
		var compact bytes.Buffer
		enc := json.NewEncoder(&compact)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(p); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "    {nkey: %q, permissions: %s}\n", pub, strings.TrimSpace(compact.String()))
	}
	fmt.Fprintf(&b, "    # %s: TEST-ONLY user of the chaos suite's checks (reads every stream and bucket); no install has it\n", inspectorUser)
	fmt.Fprintf(&b, "    {nkey: %q}\n", c.inspectorPub)
	b.WriteString("  ]\n}\n")
	return b.String()
}

// provision runs `telorunner provision` once as the provisioner, with the
// limits the services get (RUNNER_NATS_REPLICAS, RUNNER_OWNER_TTL_MS, …).
func (s *system) provision(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bins.dir, "telorunner"), "provision")
	cmd.Env = append(append([]string{}, s.common...),
		"RUNNER_NATS_NKEY_FILE="+s.creds.seed("provisioner"),
		"RUNNER_DATA_DIR="+filepath.Join(s.dir, "provision"))
	out, err := cmd.CombinedOutput()
	logf := filepath.Join(s.dir, "logs", "provision.log")
	if f, ferr := os.OpenFile(logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
		_, _ = f.Write(out)
		_ = f.Close()
	}
	if err != nil {
		return fmt.Errorf("telorunner provision: %v\n%s", err, out)
	}
	return nil
}
