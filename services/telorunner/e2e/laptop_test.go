package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// startListening starts the all-in-one the way main does: it opens its
// own listener from PORT and RUNNER_LISTEN_HOST. It returns the address
// it reported.
func startListening(t *testing.T, vars map[string]string) *net.TCPAddr {
	t.Helper()
	vars["RUNNER_DATA_DIR"] = t.TempDir()
	vars["RUNNER_KERNEL_COMMAND"] = devkernel
	vars["RUNNER_WORKSPACE_SERVER_COMMAND"] = workspaceServer
	cfg, err := allinone.LoadConfig(env(vars))
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- allinone.Run(ctx, cfg, allinone.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready: func(a net.Addr, _ string) { ready <- a }})
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("runner exited early: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("runner not ready in 30s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runner Run() = %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("runner did not stop within 60s")
		}
	})
	return addr.(*net.TCPAddr)
}

// otherAddress is an address of this machine that is not loopback
// (what `hostname -I` lists first).
func otherAddress(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP
		}
	}
	t.Fatalf("this machine has no non-loopback IPv4 address (interfaces: %v): the test needs one to prove the runner refuses it", addrs)
	return nil
}

// TestLaptopDefaults: a fresh all-in-one answers on 127.0.0.1 only,
// refuses connections on the machine's other addresses and refuses a
// foreign page's request with 403 origin_not_allowed (issue 18).
func TestLaptopDefaults(t *testing.T) {
	other := otherAddress(t)
	port := freePort(t)
	addr := startListening(t, map[string]string{"PORT": strconv.Itoa(port)})
	if !addr.IP.Equal(net.IPv4(127, 0, 0, 1)) || addr.Port != port {
		t.Fatalf("listening on %v, want 127.0.0.1:%d", addr, port)
	}
	base := "http://" + addr.String()
	if res := do(t, http.MethodGet, base+"/v1/health", nil, nil); res.Status != http.StatusOK {
		t.Fatalf("GET /v1/health on loopback = %d, want 200", res.Status)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(other.String(), strconv.Itoa(port)), 5*time.Second)
	if err == nil {
		_ = conn.Close()
		t.Fatalf("connected to %s:%d: the runner must not answer on non-loopback addresses by default", other, port)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial %s:%d = %v, want connection refused", other, port, err)
	}

	res := do(t, http.MethodPost, base+"/v1/sessions", runBody(manifest("hello", nil, map[string]any{"exitAfterMs": 100}), nil, false),
		map[string]string{"Origin": "https://example.com", "Content-Type": "application/json"})
	var env struct {
		Error string `json:"error"`
	}
	res.json(t, &env)
	if res.Status != http.StatusForbidden || env.Error != "origin_not_allowed" {
		t.Errorf("POST /v1/sessions from https://example.com = %d %s, want 403 origin_not_allowed", res.Status, res.Body)
	}
	res = do(t, http.MethodGet, base+"/v1/health", nil, map[string]string{"Origin": "http://localhost:5173"})
	if res.Status != http.StatusOK || res.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Errorf("GET /v1/health from http://localhost:5173 = %d, allow-origin %q; want 200 echoed", res.Status, res.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestListenHostOpens: RUNNER_LISTEN_HOST=0.0.0.0 makes the all-in-one
// answer on the machine's other addresses.
func TestListenHostOpens(t *testing.T) {
	other := otherAddress(t)
	port := freePort(t)
	startListening(t, map[string]string{"PORT": strconv.Itoa(port), "RUNNER_LISTEN_HOST": "0.0.0.0"})
	res := do(t, http.MethodGet, "http://"+net.JoinHostPort(other.String(), strconv.Itoa(port))+"/v1/health", nil, nil)
	if res.Status != http.StatusOK {
		t.Fatalf("GET /v1/health on %s = %d, want 200", other, res.Status)
	}
}

// The local backend runs no images: a catalog entry whose image is not an
// absolute path to an executable is neither advertised (apps, agents) nor
// accepted; a runnable one is both.
func TestLocalCatalogOffersOnlyRunnableApps(t *testing.T) {
	r := watchRunner(t, map[string]string{
		"RUNNER_APPS": fmt.Sprintf(`{"image-only":{"image":"telorun/authoring-agent:latest-slim","port":8080,"title":"Needs a container"},`+
			`"runnable":{"image":%q,"port":8081}}`, devkernel),
	})
	var caps struct {
		Features struct {
			Agents []string `json:"agents"`
		} `json:"features"`
		Apps []struct {
			Name string `json:"name"`
		} `json:"apps"`
	}
	do(t, http.MethodGet, r.URL+"/v1/capabilities", nil, nil).json(t, &caps)
	if len(caps.Apps) != 1 || caps.Apps[0].Name != "runnable" {
		t.Errorf("capabilities apps = %+v, want only runnable", caps.Apps)
	}
	if len(caps.Features.Agents) != 1 || caps.Features.Agents[0] != "runnable" {
		t.Errorf("capabilities agents = %v, want only runnable", caps.Features.Agents)
	}
	res := do(t, http.MethodPost, r.URL+"/v1/apps/image-only/sessions", map[string]any{"env": map[string]any{}}, nil)
	if res.Status != http.StatusNotFound || !strings.Contains(string(res.Body), `"unknown_app"`) {
		t.Errorf("POST /v1/apps/image-only/sessions = %d %s, want 404 unknown_app", res.Status, res.Body)
	}
}
