//go:build linux

package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Namespace is the session namespace every Env creates.
const Namespace = "telo-sessions"

const (
	startTimeout = 90 * time.Second // the whole control plane; ~4 s is usual
	stopGrace    = 5 * time.Second
	pollInterval = 25 * time.Millisecond
)

// Options configures Start. The zero value is the usual environment.
type Options struct {
	// RolePath is a plain YAML file with the driver's Role (and optionally
	// RoleBindings, ClusterRoles, ClusterRoleBindings). Default:
	// <repository>/deploy/kubernetes/role.yaml, found from the working
	// directory upwards (the directory holding go.work).
	RolePath string
	// NoControllerManager leaves out kube-controller-manager: objects owned
	// by a deleted pod then stay, and only the test creates service accounts.
	NoControllerManager bool
}

// Env is a running control plane. Its fields are read-only.
type Env struct {
	// Admin authenticates as a member of system:masters.
	Admin *rest.Config
	// Driver authenticates as DriverUser, which holds only what the role
	// file grants (bound in Namespace; ClusterRoles cluster-wide).
	Driver *rest.Config
	// Namespace is "telo-sessions", labelled
	// pod-security.kubernetes.io/enforce=restricted (and warn), with a
	// default ServiceAccount.
	Namespace string
	// Server is the API server's https URL.
	Server string
	// KubeletName is the Node name StartKubelet registers.
	KubeletName string
	// PodIPBase is "127.X", unique on this machine while the Env lives; the
	// stand-in kubelet gives pods addresses under it.
	PodIPBase string

	t        testing.TB
	dir      string
	ipLock   *os.File
	mu       sync.Mutex // guards procs, kubeconfigs, kubelet
	procs    []*proc
	kubeconf map[string]string // token → kubeconfig path
	kubelet  *proc
}

// Start runs etcd, kube-apiserver and (unless o.NoControllerManager)
// kube-controller-manager, creates Namespace with its default
// ServiceAccount, and applies the role file bound to DriverUser. It blocks
// until DriverUser is authorized, and fails the test on any error. Everything
// is stopped and removed in t.Cleanup.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	names := []string{"etcd", "kube-apiserver"}
	if !o.NoControllerManager {
		names = append(names, "kube-controller-manager")
	}
	bin := bins(t, names...)

	rolePath := o.RolePath
	if rolePath == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatalf("kubetest: find default role file: %v", err)
		}
		rolePath = filepath.Join(root, "deploy", "kubernetes", "role.yaml")
	}
	rf, err := loadRBAC(rolePath)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}

	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		t.Fatalf("kubetest: create temp dir: %v", err)
	}
	e := &Env{Namespace: Namespace, KubeletName: "kubetest-node", t: t, dir: dir, kubeconf: map[string]string{}}
	t.Cleanup(e.close) // registered first, so it runs after every stop below

	e.PodIPBase, e.ipLock, err = claimPodIPBase()
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	began := time.Now()
	if err := e.start(ctx, bin, rf, !o.NoControllerManager); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Logf("kubetest: control plane at %s ready in %s (dir %s)", e.Server, time.Since(began).Round(time.Millisecond), dir)
	return e
}

func (e *Env) start(ctx context.Context, bin map[string]string, rf *rbacFile, withKCM bool) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcd, err := e.run("etcd", bin["etcd"],
		"--data-dir", filepath.Join(e.dir, "etcd"),
		"--listen-client-url", etcdURL,
		"--listen-peer-url", "http://127.0.0.1:"+strconv.Itoa(ports[1]))
	if err != nil {
		return err
	}
	if err := waitLog(ctx, etcd, "etcd ready"); err != nil {
		return err
	}

	adminToken, driverToken := token(), token()
	tokens := filepath.Join(e.dir, "tokens.csv")
	lines := adminToken + `,kubetest-admin,kubetest-admin,"system:masters"` + "\n" +
		driverToken + "," + DriverUser + "," + DriverUser + "\n"
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	pub, priv, err := writeServiceAccountKeys(e.dir)
	if err != nil {
		return err
	}
	certDir := filepath.Join(e.dir, "certs")
	e.Server = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	api, err := e.run("kube-apiserver", bin["kube-apiserver"],
		"--etcd-servers="+etcdURL,
		"--cert-dir="+certDir,
		"--secure-port="+strconv.Itoa(ports[2]),
		"--bind-address=127.0.0.1",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pub,
		"--service-account-signing-key-file="+priv,
		"--token-auth-file="+tokens,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none")
	if err != nil {
		return err
	}
	ca, err := waitReady(ctx, api, e.Server, filepath.Join(certDir, "apiserver.crt"), adminToken)
	if err != nil {
		return err
	}
	e.Admin = restConfig(e.Server, ca, adminToken)
	e.Driver = restConfig(e.Server, ca, driverToken)

	var kcm *proc
	if withKCM {
		kc, err := e.writeKubeconfig(e.Admin)
		if err != nil {
			return err
		}
		kcm, err = e.run("kube-controller-manager", bin["kube-controller-manager"],
			"--kubeconfig="+kc,
			// job and ttl-after-finished: the run-image build Jobs
			// (contract 11.11) run and go after their TTL.
			"--controllers=garbagecollector,namespace,serviceaccount,job,ttl-after-finished",
			"--leader-elect=false",
			"--secure-port=0")
		if err != nil {
			return err
		}
	}

	admin, err := kubernetes.NewForConfig(e.Admin)
	if err != nil {
		return fmt.Errorf("create admin client: %w", err)
	}
	driver, err := kubernetes.NewForConfig(e.Driver)
	if err != nil {
		return fmt.Errorf("create driver client: %w", err)
	}
	if err := e.createNamespace(ctx, admin, ca); err != nil {
		return err
	}
	if err := rf.apply(ctx, admin, driver, e.Namespace); err != nil {
		return err
	}
	if kcm != nil {
		if done, err := kcm.exited(); done {
			return errors.New(kcm.failure(err))
		}
	}
	return nil
}

// createNamespace creates Namespace with the restricted Pod Security labels,
// its default ServiceAccount (unless the controller-manager was first) and,
// as the controller-manager's root-ca-cert-publisher does in a real cluster,
// the kube-root-ca.crt ConfigMap that service account token volumes use.
func (e *Env) createNamespace(ctx context.Context, admin kubernetes.Interface, ca []byte) error {
	return createNamespace(ctx, admin, ca, e.Namespace)
}

func createNamespace(ctx context.Context, admin kubernetes.Interface, ca []byte, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
		},
	}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	_, err := admin.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create default service account: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: name},
		Data:       map[string]string{"ca.crt": string(ca)},
	}
	if _, err := admin.CoreV1().ConfigMaps(name).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create kube-root-ca.crt: %w", err)
	}
	return nil
}

// run starts a child and records it for close.
func (e *Env) run(name, bin string, args ...string) (*proc, error) {
	p, err := startProc(e.dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// close stops every child, newest first, logs their output when the test
// failed, and removes the temporary directory.
func (e *Env) close() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(stopGrace)
	}
	if e.t.Failed() {
		for _, p := range procs {
			e.t.Logf("kubetest: --- %s log (tail) ---\n%s", p.name, p.tail(8192))
		}
	}
	if e.ipLock != nil {
		_ = e.ipLock.Close()
	}
	if err := os.RemoveAll(e.dir); err != nil {
		e.t.Errorf("kubetest: remove %s: %v", e.dir, err)
	}
}

// restConfig is a token-authenticated config trusting ca.
func restConfig(server string, ca []byte, token string) *rest.Config {
	return &rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             200,
		Burst:           400,
	}
}

// waitReady polls /readyz until it answers 200 and returns the CA bundle
// the API server wrote to certFile (its self-signed serving certificate).
func waitReady(ctx context.Context, api *proc, server, certFile, token string) ([]byte, error) {
	var ca []byte
	var last error
	err := poll(ctx, func() (bool, error) {
		if done, err := api.exited(); done {
			return false, errors.New(api.failure(err))
		}
		b, err := os.ReadFile(certFile)
		if err != nil {
			last = err
			return false, nil
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			last = fmt.Errorf("no certificate in %s yet", certFile)
			return false, nil
		}
		c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		}}
		defer c.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		if err != nil {
			return false, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("/readyz: %s", resp.Status)
			return false, nil
		}
		ca = b
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for kube-apiserver: %w (last: %v)\n--- kube-apiserver log (tail) ---\n%s", err, last, api.tail(4096))
	}
	return ca, nil
}

// waitLog waits until p's log contains line.
func waitLog(ctx context.Context, p *proc, line string) error {
	err := poll(ctx, func() (bool, error) {
		if done, err := p.exited(); done {
			return false, errors.New(p.failure(err))
		}
		b, err := os.ReadFile(p.logPath)
		return err == nil && strings.Contains(string(b), line), nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s: %w", p.name, err)
	}
	return nil
}

// poll calls cond every pollInterval until it returns true or an error, or
// ctx ends.
func poll(ctx context.Context, cond func() (bool, error)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// token is a random bearer token.
func token() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// writeServiceAccountKeys writes an RSA key pair for signing service
// account tokens and returns the public and private key paths.
func writeServiceAccountKeys(dir string) (pub, priv string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generate service account key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("marshal service account key: %w", err)
	}
	pub = filepath.Join(dir, "sa.pub")
	priv = filepath.Join(dir, "sa.key")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		return "", "", fmt.Errorf("write service account key: %w", err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(priv, privPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write service account key: %w", err)
	}
	return pub, priv, nil
}

// repoRoot is the nearest directory above the working directory holding
// go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory; set Options.RolePath")
		}
		dir = parent
	}
}

// AddNamespace creates another namespace as Start creates Namespace
// (restricted Pod Security, default ServiceAccount, kube-root-ca.crt) and
// applies the role file at rolePath there, bound to DriverUser, e.g. the
// build namespace with deploy/kubernetes/build-role.yaml. It fails the
// test on error.
func (e *Env) AddNamespace(t testing.TB, name, rolePath string) {
	t.Helper()
	rf, err := loadRBAC(rolePath)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	admin, err := kubernetes.NewForConfig(e.Admin)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	driver, err := kubernetes.NewForConfig(e.Driver)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createNamespace(ctx, admin, e.Admin.TLSClientConfig.CAData, name); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if err := rf.apply(ctx, admin, driver, name); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}
