//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/telorunner/telorunner/tools/kubetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// client-go keeps idle keep-alive connections in a shared transport cache.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

func TestStart(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	admin := clientset(t, env.Admin)
	driver := clientset(t, env.Driver)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	t.Run("namespace is restricted", func(t *testing.T) {
		ns, err := admin.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Get(namespace %s) error = %v", env.Namespace, err)
		}
		if got, want := ns.Labels["pod-security.kubernetes.io/enforce"], "restricted"; got != want {
			t.Errorf("enforce label = %q, want %q", got, want)
		}
	})

	t.Run("driver lists pods", func(t *testing.T) {
		if _, err := driver.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("List(pods) as driver error = %v, want nil", err)
		}
	})

	t.Run("driver creates restricted pod", func(t *testing.T) {
		pod, err := driver.CoreV1().Pods(env.Namespace).Create(ctx, restrictedPod("ok"), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("Create(restricted pod) as driver error = %v, want nil", err)
		}
		if pod.Spec.ServiceAccountName != "default" {
			t.Errorf("pod service account = %q, want %q", pod.Spec.ServiceAccountName, "default")
		}
	})

	t.Run("pod security rejects privileged pod", func(t *testing.T) {
		p := restrictedPod("loose")
		p.Spec.Containers[0].SecurityContext = nil
		_, err := admin.CoreV1().Pods(env.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
			t.Errorf("Create(pod without security context) error = %v, want Forbidden by PodSecurity", err)
		}
	})

	t.Run("driver cannot read secrets", func(t *testing.T) {
		_, err := driver.CoreV1().Secrets(env.Namespace).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("List(secrets) as driver error = %v, want Forbidden", err)
		}
	})

	t.Run("driver confined to namespace", func(t *testing.T) {
		_, err := driver.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("List(pods in default) as driver error = %v, want Forbidden", err)
		}
	})

	// Passes only if kube-controller-manager runs, which needs the admin
	// kubeconfig KubeconfigPath wrote for it.
	t.Run("garbage collector removes owned objects", func(t *testing.T) {
		pod, err := driver.CoreV1().Pods(env.Namespace).Create(ctx, restrictedPod("owner"), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("Create(pod) error = %v", err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: "owned",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			}},
		}}
		if _, err := driver.CoreV1().ConfigMaps(env.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("Create(configmap) error = %v", err)
		}
		if err := driver.CoreV1().Pods(env.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("Delete(pod) error = %v", err)
		}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			_, err := driver.CoreV1().ConfigMaps(env.Namespace).Get(ctx, cm.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("Get(owned configmap) error = %v after the owner was deleted, want NotFound", err)
			case <-tick.C:
			}
		}
	})
}

func TestStartKubelet(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	env.StartKubelet(t, kubetest.KubeletOptions{Images: map[string]string{"sleeper": "/bin/sleep"}})
	driver := clientset(t, env.Driver)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	p := restrictedPod("sleeper")
	p.Spec.NodeName = env.KubeletName
	p.Spec.AutomountServiceAccountToken = new(false) // as the contract's session pods
	p.Spec.Containers[0].Image = "sleeper"
	p.Spec.Containers[0].Args = []string{"60"}
	if _, err := driver.CoreV1().Pods(env.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("Create(pod) error = %v", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := driver.CoreV1().Pods(env.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Get(pod) error = %v", err)
		}
		if got.Status.Phase == corev1.PodRunning {
			if !strings.HasPrefix(got.Status.PodIP, env.PodIPBase+".") {
				t.Errorf("pod IP = %q, want one under %s", got.Status.PodIP, env.PodIPBase)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod phase = %s (%s), want Running", got.Status.Phase, got.Status.Message)
		case <-tick.C:
		}
	}
}

func TestStartWithoutBinaries(t *testing.T) {
	t.Setenv(kubetest.BinEnv, t.TempDir())
	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		kubetest.Start(ft, kubetest.Options{})
	}()
	<-done
	if !strings.Contains(ft.msg, "kube-apiserver") || !strings.Contains(ft.msg, "make kube-bins") {
		t.Errorf("Start() without binaries fails with %q, want it to name kube-apiserver and `make kube-bins`", ft.msg)
	}
}

// fatalTB records the first Fatalf and ends the goroutine like testing does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func restrictedPod(name string) *corev1.Pod {
	no, yes := false, true
	uid := int64(1000)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "kernel",
				Image: "kernel",
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

func clientset(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("NewForConfig() error = %v", err)
	}
	return cs
}
