package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string // Variable the error must name; "" = no error.
	}{
		{"defaults but dir", map[string]string{"WORKSPACE_DIR": dir}, Config{Dir: dir, Port: 8099, Bind: "0.0.0.0"}, ""},
		{"all set", map[string]string{"WORKSPACE_DIR": dir, "PORT": "9000", "WORKSPACE_BIND": "127.0.0.1", "WORKSPACE_EXCLUDE": `["dist"]`},
			Config{Dir: dir, Port: 9000, Bind: "127.0.0.1", Exclude: []string{"dist"}}, ""},
		{"pod ip narrows the wildcard", map[string]string{"WORKSPACE_DIR": dir, "POD_IP": "127.1.0.7"}, Config{Dir: dir, Port: 8099, Bind: "127.1.0.7"}, ""},
		{"bind beats pod ip", map[string]string{"WORKSPACE_DIR": dir, "POD_IP": "127.1.0.7", "WORKSPACE_BIND": "127.0.0.1"}, Config{Dir: dir, Port: 8099, Bind: "127.0.0.1"}, ""},
		{"pod ip not an IP", map[string]string{"WORKSPACE_DIR": dir, "POD_IP": "pod"}, Config{}, "POD_IP"},
		{"exclude nothing", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_EXCLUDE": `[]`}, Config{Dir: dir, Port: 8099, Bind: "0.0.0.0", Exclude: []string{}}, ""},
		{"default dir missing here", map[string]string{"WORKSPACE_DIR": filepath.Join(dir, "missing")}, Config{}, "WORKSPACE_DIR"},
		{"dir is a file", map[string]string{"WORKSPACE_DIR": file}, Config{}, "WORKSPACE_DIR"},
		{"port not a number", map[string]string{"WORKSPACE_DIR": dir, "PORT": "http"}, Config{}, "PORT"},
		{"port zero", map[string]string{"WORKSPACE_DIR": dir, "PORT": "0"}, Config{}, "PORT"},
		{"port too big", map[string]string{"WORKSPACE_DIR": dir, "PORT": "65536"}, Config{}, "PORT"},
		{"bind hostname", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_BIND": "localhost"}, Config{}, "WORKSPACE_BIND"},
		{"exclude not JSON", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_EXCLUDE": "node_modules"}, Config{}, "WORKSPACE_EXCLUDE"},
		{"exclude null", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_EXCLUDE": "null"}, Config{}, "WORKSPACE_EXCLUDE"},
		{"exclude object", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_EXCLUDE": `{"a":1}`}, Config{}, "WORKSPACE_EXCLUDE"},
		{"exclude path", map[string]string{"WORKSPACE_DIR": dir, "WORKSPACE_EXCLUDE": `["a/b"]`}, Config{}, "WORKSPACE_EXCLUDE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadConfig(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr+":") {
					t.Fatalf("loadConfig() = %v, want an error naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadConfig() = %v", err)
			}
			if got.Dir != tt.want.Dir || got.Port != tt.want.Port || got.Bind != tt.want.Bind ||
				strings.Join(got.Exclude, ",") != strings.Join(tt.want.Exclude, ",") || (got.Exclude == nil) != (tt.want.Exclude == nil) {
				t.Fatalf("loadConfig() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// buildBinary compiles the command once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building the binary under test needs the go command on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "workspace-server")
	out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// The binary runs with exactly its four variables and nothing else (no
// PATH, HOME or credentials), serves, and stops cleanly on SIGTERM.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	port := freePort(t)
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"WORKSPACE_DIR=" + dir,
		"PORT=" + strconv.Itoa(port),
		"WORKSPACE_BIND=127.0.0.1",
		`WORKSPACE_EXCLUDE=["dist"]`,
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			t.Logf("killed workspace-server: %v", <-exited)
		}
	})

	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	c := wsapi.New("http://127.0.0.1:"+strconv.Itoa(port), &http.Client{Transport: transport})
	ctx := t.Context()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Health(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Health() never succeeded: %v\n%s", err, stderr.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("workspace-server exited early: %v\n%s", err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}

	if _, err := c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{
		{Path: "app/telo.yaml", Content: "kind: Application\n"},
		{Path: "dist/x.js", Content: "excluded by the env override"},
		{Path: "node_modules/m.js", Content: "listed by the env override"},
	}}); err != nil {
		t.Fatalf("Apply() = %v", err)
	}
	got, err := c.Read(ctx, "app/telo.yaml", "")
	if err != nil || got.Content != "kind: Application\n" {
		t.Fatalf("Read() = %+v, %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "app", "telo.yaml")); err != nil || string(b) != "kind: Application\n" {
		t.Fatalf("file on disk = %q, %v", b, err)
	}
	tr, err := c.Tree(ctx)
	if err != nil || len(tr.Files) != 2 || tr.Files[0].Path != "app/telo.yaml" || tr.Files[1].Path != "node_modules/m.js" {
		t.Fatalf("Tree() = %+v, %v; want app/telo.yaml and node_modules/m.js", tr, err)
	}
	transport.CloseIdleConnections()

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("workspace-server after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("workspace-server did not stop on SIGTERM")
	}
}

func TestBinaryBadConfig(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	tests := []struct {
		name, variable string
		env            []string
	}{
		{"bad port", "PORT", []string{"WORKSPACE_DIR=" + dir, "PORT=eighty"}},
		{"bad exclude", "WORKSPACE_EXCLUDE", []string{"WORKSPACE_DIR=" + dir, "WORKSPACE_EXCLUDE=node_modules"}},
		{"missing dir", "WORKSPACE_DIR", []string{"WORKSPACE_DIR=" + filepath.Join(dir, "missing")}},
		{"bad bind", "WORKSPACE_BIND", []string{"WORKSPACE_DIR=" + dir, "WORKSPACE_BIND=::1::"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin)
			cmd.Env = tt.env
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit = %v, want status 2\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.variable+":") {
				t.Fatalf("stderr does not name %s:\n%s", tt.variable, stderr.String())
			}
		})
	}
}
