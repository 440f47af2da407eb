package kubelet

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

// envKubeBin names the directory holding kube-apiserver and etcd.
const envKubeBin = "TELORUNNER_KUBE_BIN"

// controlPlane is etcd plus kube-apiserver, children of the test.
type controlPlane struct {
	URL        string
	Token      string
	Kubeconfig string
	logs       []string
}

// startControlPlane starts etcd and kube-apiserver (RBAC, token auth) on
// free loopback ports and waits until the API server is ready. Both stop
// when the test ends.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	bin := os.Getenv(envKubeBin)
	if bin == "" {
		t.Fatalf("%s is not set: it must name a directory with kube-apiserver and etcd "+
			"(built into $HOME/.cache/telorunner/kube-v1.37.2-*/ by tools/kubeenv; `make test` sets it)", envKubeBin)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			t.Fatalf("%s=%s: %v", envKubeBin, bin, err)
		}
	}
	dir := t.TempDir()
	cp := &controlPlane{Token: "admin-token"}
	begin := time.Now()

	etcdClient, etcdPeer, apiPort := freePort(t), freePort(t), freePort(t)
	etcdOut := cp.start(t, dir, "etcd", filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-url", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--listen-peer-url", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
	)
	waitLine(t, etcdOut, "etcd ready", 30*time.Second)

	pub, priv := serviceAccountKeys(t, dir)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(cp.Token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cp.start(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClient),
		"--cert-dir="+filepath.Join(dir, "certs"),
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--bind-address=127.0.0.1",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pub,
		"--service-account-signing-key-file="+priv,
		"--token-auth-file="+tokens,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
	)
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	cp.waitReady(t, 60*time.Second)
	t.Logf("control plane ready in %v", time.Since(begin).Round(time.Millisecond))

	cp.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, cp.URL, cp.Token)
	if err := os.WriteFile(cp.Kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return cp
}

// start runs a child in its own process group with a parent-death signal;
// stderr goes to a log file shown when the test fails. It returns stdout.
func (cp *controlPlane) start(t *testing.T, dir, name, path string, args ...string) io.Reader {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	cp.logs = append(cp.logs, logPath)
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s log (tail):\n%s", name, tail(string(b), 40))
			}
		}
	})
	return out
}

func (cp *controlPlane) waitReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	var last string
	ready := testutil.Poll(timeout, 100*time.Millisecond, func() bool {
		req, _ := http.NewRequest(http.MethodGet, cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.Token)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, tail(string(b), 5))
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		t.Fatalf("kube-apiserver not ready after %v: %s", timeout, last)
	}
}

// waitLine reads r until a line equals want; the rest of r is drained in
// the background so the child never blocks on a full pipe.
func waitLine(t *testing.T, r io.Reader, want string, timeout time.Duration) {
	t.Helper()
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(r)
		seen := false
		for sc.Scan() {
			if !seen && strings.TrimSpace(sc.Text()) == want {
				seen = true
				close(found)
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(timeout):
		t.Fatalf("no %q line after %v", want, timeout)
	}
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

func serviceAccountKeys(t *testing.T, dir string) (pub, priv string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(priv, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctxFor returns a context that ends with the test or after d.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
