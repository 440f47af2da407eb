package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// The credential boundary (contract 10.6, 12.3): operator env reaches the
// agent only, session env the apps only, and the workspace server neither.
func TestWatchCredentialBoundary(t *testing.T) {
	dir := t.TempDir()
	// The kernel is wrapped so it leaves its environment beside its entry
	// manifest, inside the workspace, where the API can read it.
	wrapper := filepath.Join(dir, "kernel.sh")
	script := fmt.Sprintf("#!/bin/sh\nfor a; do last=$a; done\nenv > \"$(dirname \"$last\")/.kernel-env-$$\"\nexec %s \"$@\"\n", devkernel)
	agent := filepath.Join(dir, "agent.sh")
	agentScript := "#!/bin/sh\nenv > \"$WORKSPACE_DIR/.agent-env\"\nexec sleep 600\n"
	for p, s := range map[string]string{wrapper: script, agent: agentScript} {
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	agentPort := freePort(t)
	r := watchRunner(t, map[string]string{
		"RUNNER_KERNEL_COMMAND": wrapper,
		"RUNNER_APPS":           fmt.Sprintf(`{"helper":{"image":%q,"env":{"OPERATOR_KEY":"op-k3y"},"port":%d}}`, agent, agentPort),
	})
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("creds", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, "helper"))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	evs := sse.until(t, 60*time.Second, isStatus("running"))
	st := decode(t, evs[len(evs)-1].Data)["status"].(map[string]any)
	if ag, _ := st["agent"].(map[string]any); ag == nil || ag["port"].(float64) != float64(agentPort) {
		t.Fatalf("running.agent = %v, want port %d", st["agent"], agentPort)
	}
	read := func(path string) string {
		var f struct{ Content string }
		var resp response
		if !testkit.Poll(context.Background(), 20*time.Second, func() bool {
			resp = do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path="+path, nil, nil)
			return resp.Status == 200 && strings.Contains(string(resp.Body), "=")
		}) {
			t.Fatalf("read %s: no variables within 20s; last %d %s", path, resp.Status, resp.Body)
		}
		resp.json(t, &f)
		return f.Content
	}
	agentEnv := read(".agent-env")
	if !strings.Contains(agentEnv, "OPERATOR_KEY=op-k3y") || !strings.Contains(agentEnv, "WORKSPACE_DIR=") || strings.Contains(agentEnv, "SESSION_SECRET") {
		t.Fatalf("agent env = %q, want the operator env and WORKSPACE_DIR, no session env", agentEnv)
	}
	var tree struct{ Files []struct{ Path string } }
	var kernelEnvPath string
	testkit.Eventually(t, 20*time.Second, func() bool {
		do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace", nil, nil).json(t, &tree)
		for _, f := range tree.Files {
			if strings.HasPrefix(f.Path, ".kernel-env-") {
				kernelEnvPath = f.Path
			}
		}
		return kernelEnvPath != ""
	}, "no .kernel-env-* file in the workspace tree")
	kernelEnv := read(kernelEnvPath)
	if !strings.Contains(kernelEnv, "SESSION_SECRET=s3cr3t") || strings.Contains(kernelEnv, "OPERATOR_KEY") || strings.Contains("\n"+kernelEnv, "\nFORCE_COLOR=") || !strings.Contains(kernelEnv, "CLICOLOR_FORCE=1") {
		t.Fatalf("kernel env = %q, want the session env and no operator env", kernelEnv)
	}
	if strings.Contains(kernelEnv, "TELO_CACHE_DIR") {
		t.Fatalf("kernel env has TELO_CACHE_DIR: %q", kernelEnv)
	}
	// The workspace server's environment, read from /proc.
	found := false
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(cmd, []byte(workspaceServer)) {
			continue
		}
		env, err := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
		if err != nil || !bytes.Contains(env, []byte(c.SessionID)) {
			continue
		}
		found = true
		if bytes.Contains(env, []byte("SESSION_SECRET")) || bytes.Contains(env, []byte("OPERATOR_KEY")) {
			t.Fatalf("workspace server env carries credentials: %q", env)
		}
	}
	if !found {
		t.Fatal("workspace server process of the session not found")
	}
}

// Catalog env stays off the bus (issue 11 item 3): an operator app
// session's record holds only the caller's variables; the driver adds the
// entry's env from its own RUNNER_APPS, so the workload still gets it.
func TestOperatorAppEnvFromDriverConfig(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "op.sh")
	// It leaves its environment in its home, the session directory the
	// sandbox lets it write.
	if err := os.WriteFile(image, []byte("#!/bin/sh\nenv > \"$HOME/op-env.tmp\" && mv \"$HOME/op-env.tmp\" \"$HOME/op-env\"\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := startRunner(t, map[string]string{"RUNNER_APPS": fmt.Sprintf(`{"op":{"image":%q,"env":{"OP_SECRET":"0p-s3cr3t","MINE":"operator"}}}`, image)})
	resp := do(t, "POST", r.URL+"/v1/apps/op/sessions", map[string]any{"env": map[string]string{"MINE": "client", "THEIRS": "t"}}, nil)
	if resp.Status != 201 {
		t.Fatalf("POST /v1/apps/op/sessions = %d %s", resp.Status, resp.Body)
	}
	var c createdResp
	resp.json(t, &c)
	var env string
	testkit.Eventually(t, 30*time.Second, func() bool {
		found, _ := filepath.Glob(filepath.Join(r.DataDir, "sessions", "*", "home", "op-env"))
		if len(found) != 1 {
			return false
		}
		b, err := os.ReadFile(found[0])
		env = string(b)
		return err == nil
	}, "operator app did not start")
	for _, want := range []string{"OP_SECRET=0p-s3cr3t", "MINE=operator", "THEIRS=t"} {
		if !strings.Contains("\n"+env, "\n"+want+"\n") {
			t.Fatalf("workload env lacks %s: %q", want, env)
		}
	}
	kv, err := jetstream.New(r.connect(t, bus.RoleSupervisor))
	if err != nil {
		t.Fatal(err)
	}
	sessions, err := kv.KeyValue(context.Background(), bus.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := sessions.Get(context.Background(), c.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if raw := string(ent.Value()); strings.Contains(raw, "0p-s3cr3t") || strings.Contains(raw, `"operator"`) {
		t.Fatalf("session record holds catalog env: %s", raw)
	}
	do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil)
}
