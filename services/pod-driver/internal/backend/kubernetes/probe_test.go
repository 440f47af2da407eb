package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/telorunner/telorunner/pkg/contract"
	kube "github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes"
	"github.com/telorunner/telorunner/tools/kubetest"
)

// The rules Probe reviews are the Roles the chart installs.
func TestRulesMatchRoleFile(t *testing.T) {
	for _, tc := range []struct {
		file  string
		rules []rbacv1.PolicyRule
	}{{"role.yaml", kube.Rules}, {"build-role.yaml", kube.BuildRules}} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "..", "deploy", "kubernetes", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.ToJSON(b)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(js, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		role, ok := obj.(*rbacv1.Role)
		if !ok {
			t.Fatalf("%s holds %T, want a Role", tc.file, obj)
		}
		if !reflect.DeepEqual(role.Rules, tc.rules) {
			t.Fatalf("%s rules %+v\nwant %+v", tc.file, role.Rules, tc.rules)
		}
	}
}

// Probe on the real API server: ready as the driver in its namespace; one
// issue per resource where the Role is not bound; the namespace issue when
// it does not exist.
func TestProbe(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{NoControllerManager: true})
	admin, err := k8s.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "unbound"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := func(cfg *rest.Config, ns string, buildNS ...string) []contract.Issue {
		t.Helper()
		o := kube.Options{RestConfig: cfg, Namespace: ns, KernelImage: kernelImage, WorkspaceImage: workspaceImage,
			RunLimits: kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
			AppLimits: kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600}}
		if len(buildNS) == 1 {
			o.ImageRepository, o.BuilderImage, o.BuildNamespace = "registry.example/telo/apps", "telo-layer:test", buildNS[0]
		}
		b, err := kube.New(o)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		issues, err := b.Probe(ctx)
		if err != nil {
			t.Fatalf("Probe(%s) = %v", ns, err)
		}
		return issues
	}
	if issues := probe(env.Driver, env.Namespace); len(issues) != 0 {
		t.Fatalf("driver in its namespace: %+v, want ready", issues)
	}
	// The Role is not bound in "unbound": one issue per resource, naming
	// every verb, and (the driver may not read namespaces) a namespace hint.
	issues := probe(env.Driver, "unbound")
	var paths []string
	for _, is := range issues {
		paths = append(paths, is.Path)
	}
	want := []string{"/kubernetes/namespace", "/kubernetes/role/pods", "/kubernetes/role/services", "/kubernetes/role/pods/log", "/kubernetes/role/pods/attach", "/kubernetes/role/ingresses", "/kubernetes/role/configmaps"}
	if !reflect.DeepEqual(paths, want) {
		t.Fatalf("unbound issues %v, want %v", paths, want)
	}
	if !strings.Contains(issues[1].Message, "get, list, watch, create, delete, update pods") {
		t.Errorf("pods issue %q, want every verb named", issues[1].Message)
	}
	// An identity that may read namespaces learns the namespace is missing.
	issues = probe(env.Admin, "missing")
	if len(issues) != 1 || issues[0].Path != "/kubernetes/namespace" || !strings.Contains(issues[0].Message, `"missing" does not exist`) {
		t.Fatalf("missing namespace: %+v, want one namespace issue", issues)
	}
	if issues := probe(env.Admin, env.Namespace); len(issues) != 0 {
		t.Fatalf("admin: %+v, want ready", issues)
	}
	// With run images built, the build namespace's Role is reviewed too.
	issues = probe(env.Driver, env.Namespace, "unbound")
	paths = nil
	for _, is := range issues {
		paths = append(paths, is.Path)
	}
	want = []string{"/kubernetes/build-role/jobs", "/kubernetes/build-role/configmaps", "/kubernetes/build-role/pods", "/kubernetes/build-role/pods/log", "/kubernetes/build-role/secrets"}
	if !reflect.DeepEqual(paths, want) {
		t.Fatalf("unbound build namespace issues %v, want %v", paths, want)
	}
	if !strings.Contains(issues[0].Message, "build-role.yaml") {
		t.Errorf("jobs issue %q, want the build role file named", issues[0].Message)
	}
}
