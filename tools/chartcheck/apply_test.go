//go:build linux

package chartcheck

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/telorunner/telorunner/tools/kubetest"
)

// warnings collects the API server's Warning headers (deprecated fields,
// Pod Security "warn" violations, unknown or duplicate fields).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

var networkPolicies = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}

type cluster struct {
	dyn    dynamic.Interface
	cs     kubernetes.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

// restrictedNS are the labels the namespaces the test creates carry: every
// pod template the chart ships must pass Pod Security "restricted" (11.17:
// non-root, seccomp RuntimeDefault, hardened containers). For workload
// objects admission reports violations as warnings, which apply turns into
// errors.
var restrictedNS = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
}

// ensureNamespace creates a namespace for real (a dry run cannot create one
// that objects are then dry-run into).
func (c *cluster) ensureNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: restrictedNS}}
	_, err := c.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// apply server-side-applies o (a dry run unless real) with strict field
// validation. Namespaced objects without a namespace go to releaseNS, as
// Helm sends them; any warning is an error.
func (c *cluster) apply(ctx context.Context, o *unstructured.Unstructured, releaseNS string, real bool) error {
	o = o.DeepCopy()
	gvk := o.GroupVersionKind()
	what := gvk.Kind + " " + o.GetName()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: the API server does not serve %s: %w", what, gvk, err)
	}
	var ri dynamic.ResourceInterface
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			o.SetNamespace(releaseNS)
		}
		ri = c.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		what += " in " + o.GetNamespace()
	} else {
		if o.GetNamespace() != "" {
			return fmt.Errorf("%s: cluster-scoped object has metadata.namespace %q", what, o.GetNamespace())
		}
		ri = c.dyn.Resource(m.Resource)
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: "chartcheck", Force: &force, FieldValidation: metav1.FieldValidationStrict}
	if !real {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	c.warn.take()
	if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if w := c.warn.take(); len(w) > 0 {
		return fmt.Errorf("%s: API server warnings: %s", what, strings.Join(w, "; "))
	}
	return nil
}

// allowed asks the authorizer whether the ServiceAccount ns/name may do a.
func (c *cluster) allowed(ctx context.Context, ns, name string, a authorizationv1.ResourceAttributes) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + ns + ":" + name,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &a,
	}}
	r, err := c.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return r.Status.Allowed, nil
}

// grants are every (group, resource, subresource, verb) of rules.
func grants(t *testing.T, rules []any, ns string) []authorizationv1.ResourceAttributes {
	t.Helper()
	strs := func(v any) []string {
		l, _ := v.([]any)
		var out []string
		for _, s := range l {
			out = append(out, s.(string))
		}
		return out
	}
	var out []authorizationv1.ResourceAttributes
	for _, r := range rules {
		rule := r.(map[string]any)
		for _, g := range strs(rule["apiGroups"]) {
			for _, res := range strs(rule["resources"]) {
				for _, v := range strs(rule["verbs"]) {
					base, sub, _ := strings.Cut(res, "/")
					out = append(out, authorizationv1.ResourceAttributes{Namespace: ns, Group: g, Resource: base, Subresource: sub, Verb: v})
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("role file grants nothing")
	}
	return out
}

// capabilities are what `helm install` renders with: the server's version
// and API groups.
func capabilities(t *testing.T, dc discovery.DiscoveryInterface) *chartutil.Capabilities {
	t.Helper()
	sv, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	groups, err := dc.ServerGroups()
	if err != nil {
		t.Fatalf("server groups: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: sv.GitVersion, Major: sv.Major, Minor: sv.Minor}
	caps.APIVersions = nil
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			caps.APIVersions = append(caps.APIVersions, v.GroupVersion)
		}
	}
	return caps
}

// TestChartOnAPIServer renders every install against a real kube-apiserver
// and applies its objects with a server-side dry run (schemas, strict field
// validation, admission incl. Pod Security), then for real, and checks with
// SubjectAccessReviews that the pod driver's ServiceAccount holds the
// Role's grants in the session namespace and nothing outside them.
func TestChartOnAPIServer(t *testing.T) {
	env := kubetest.Start(t, kubetest.Options{})
	ctx := t.Context()

	w := &warnings{}
	cfg := rest.CopyConfig(env.Admin)
	cfg.WarningHandler = w
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groupResources, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	c := &cluster{mapper: restmapper.NewDiscoveryRESTMapper(groupResources), warn: w}
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	caps := capabilities(t, dc)
	rules := roleRules(t)

	// The checks bite: a pod template that breaks "restricted" and an
	// unknown field are refused by the same apply.
	if err := c.ensureNamespace(ctx, "chartcheck-probe"); err != nil {
		t.Fatal(err)
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment", "metadata": map[string]any{"name": "root"},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"a": "b"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"a": "b"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox"}}},
			},
		},
	}}
	if err := c.apply(ctx, bad, "chartcheck-probe", false); err == nil || !strings.Contains(err.Error(), "warnings") {
		t.Errorf("dry run of a Deployment violating Pod Security restricted: error %v, want the warnings refused", err)
	}
	typo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "typo"}, "automount": false,
	}}
	if err := c.apply(ctx, typo, "chartcheck-probe", false); err == nil {
		t.Errorf("dry run of a ServiceAccount with an unknown field succeeded")
	}

	for _, in := range installs {
		t.Run(in.name, func(t *testing.T) {
			ch := loadChart(t)
			objs := mustRender(t, ch, in, caps)
			checkObjects(t, ch, objs, in, rules)

			// Namespaces the release's namespaced objects land in must
			// exist before a dry run can place anything there.
			for _, ns := range []string{in.namespace, in.want.sessionNS, in.want.buildNS} {
				if err := c.ensureNamespace(ctx, ns); err != nil {
					t.Fatalf("create namespace %s: %v", ns, err)
				}
			}
			for _, o := range objs {
				if err := c.apply(ctx, o, in.namespace, false); err != nil {
					t.Errorf("dry run: %v", err)
				}
			}
			if t.Failed() {
				return
			}
			for _, o := range objs {
				if err := c.apply(ctx, o, in.namespace, true); err != nil {
					t.Fatalf("apply: %v", err)
				}
			}

			checkIsolationOnServer(t, c, in, objs)

			sa := in.release + "-pod-driver"
			pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			granted := grants(t, rules, in.want.sessionNS)
			for _, a := range grants(t, buildRules(t, in), in.want.buildNS) {
				if a.Resource == "secrets" {
					a.Name = in.want.pushSecret // granted by name only
				}
				granted = append(granted, a)
			}
			for _, a := range granted {
				var last error
				err := wait.PollUntilContextCancel(pollCtx, 25*time.Millisecond, true, func(ctx context.Context) (bool, error) {
					ok, err := c.allowed(ctx, in.namespace, sa, a)
					last = err
					return ok, nil
				})
				if err != nil {
					t.Errorf("ServiceAccount %s/%s may not %s %s/%s %s in %s: %v %v", in.namespace, sa, a.Verb, a.Group, a.Resource, a.Subresource, a.Namespace, err, last)
				}
			}
			// Nothing beyond the Role: not in the session namespace, not
			// in the release namespace, not cluster-wide.
			for _, a := range []authorizationv1.ResourceAttributes{
				{Namespace: in.want.sessionNS, Verb: "get", Resource: "secrets"},
				{Namespace: in.want.sessionNS, Verb: "create", Resource: "pods", Subresource: "exec"},
				{Namespace: in.want.sessionNS, Verb: "patch", Resource: "pods"},
				// The build namespace: Jobs make the pods; no exec; no
				// Secret but the push Secret, by name.
				{Namespace: in.want.buildNS, Verb: "create", Resource: "pods"},
				{Namespace: in.want.buildNS, Verb: "create", Resource: "pods", Subresource: "exec"},
				{Namespace: in.want.buildNS, Verb: "list", Resource: "secrets"},
				{Namespace: in.want.buildNS, Verb: "get", Resource: "secrets", Name: "not-the-push-secret"},
				{Namespace: in.want.buildNS, Verb: "update", Resource: "jobs", Group: "batch"},
				{Namespace: in.namespace, Verb: "create", Resource: "pods"},
				{Verb: "list", Resource: "pods"},
			} {
				ok, err := c.allowed(ctx, in.namespace, sa, a)
				if err != nil || ok {
					t.Errorf("ServiceAccount %s/%s allowed to %s %s/%s in %q: %v (err %v), want denied", in.namespace, sa, a.Verb, a.Resource, a.Subresource, a.Namespace, ok, err)
				}
			}
			// The other services run without a token and get nothing.
			ok, err := c.allowed(ctx, in.namespace, "default", authorizationv1.ResourceAttributes{Namespace: in.want.sessionNS, Verb: "get", Resource: "pods"})
			if err != nil || ok {
				t.Errorf("default ServiceAccount of %s may get pods in %s: %v (err %v)", in.namespace, in.want.sessionNS, ok, err)
			}
		})
	}
}

// checkIsolationOnServer evaluates the session NetworkPolicy as stored by
// the API server against the cluster as it is: no egress peer's namespace
// selector matches the release namespace's real labels, and every ipBlock
// excludes the ClusterIP of every Service in the release namespace (NATS,
// the edge) and the API server's own Service. The stand-in kubelet does
// not enforce NetworkPolicy, so this checks the rules, not packets.
func checkIsolationOnServer(t *testing.T, c *cluster, in install, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	if in.want.noSessionGuards {
		return
	}
	np, err := c.dyn.Resource(networkPolicies).Namespace(in.want.sessionNS).Get(ctx, in.release+"-sessions", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get session NetworkPolicy: %v", err)
	}
	ns, err := c.cs.CoreV1().Namespaces().Get(ctx, in.namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := c.cs.CoreV1().Services(in.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	api, err := c.cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP != "" && s.Spec.ClusterIP != "None" {
			ips = append(ips, s.Namespace+"/"+s.Name+"="+s.Spec.ClusterIP)
		}
	}
	ips = append(ips, "default/kubernetes="+api.Spec.ClusterIP)
	if len(ips) < 2 {
		t.Fatalf("release namespace %s has no Service with a ClusterIP: nothing to check against", in.namespace)
	}
	for _, e := range sessionEgressReaches(t, np, ns.Labels, ips) {
		t.Errorf("session NetworkPolicy egress reaches %s", e)
	}

	// The same evaluation finds a rule that opens the release namespace,
	// and an ipBlock without the private ranges.
	bad := np.DeepCopy()
	egress, _, _ := unstructured.NestedSlice(bad.Object, "spec", "egress")
	egress = append(egress,
		map[string]any{"to": []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": in.namespace}}}}},
		map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0"}}}})
	if err := unstructured.SetNestedSlice(bad.Object, egress, "spec", "egress"); err != nil {
		t.Fatal(err)
	}
	if got := sessionEgressReaches(t, bad, ns.Labels, ips); len(got) != 1+len(ips) {
		t.Errorf("evaluation of a policy open to the release namespace found %q, want the namespace and %d Services", got, len(ips))
	}
}

// sessionEgressReaches lists what np's egress rules reach of the release
// namespace (labelled nsLabels) and of the Services ("ns/name=ip").
func sessionEgressReaches(t *testing.T, np *unstructured.Unstructured, nsLabels map[string]string, svcIPs []string) []string {
	t.Helper()
	var out []string
	for _, p := range egressPeers(np) {
		if sel, ok := p["namespaceSelector"].(map[string]any); ok {
			if selector(t, "egress", sel).Matches(labels.Set(nsLabels)) {
				out = append(out, fmt.Sprintf("the release namespace (peer %v)", p))
			}
		}
		block, ok := p["ipBlock"].(map[string]any)
		if !ok {
			continue
		}
		cidr, err := netip.ParsePrefix(fmt.Sprint(block["cidr"]))
		if err != nil {
			t.Fatalf("ipBlock %v: %v", block, err)
		}
		except, _ := block["except"].([]any)
		for _, s := range svcIPs {
			_, ipStr, _ := strings.Cut(s, "=")
			ip := netip.MustParseAddr(ipStr)
			if !cidr.Contains(ip) {
				continue
			}
			excluded := false
			for _, e := range except {
				if ex, err := netip.ParsePrefix(fmt.Sprint(e)); err == nil && ex.Contains(ip) {
					excluded = true
				}
			}
			if !excluded {
				out = append(out, fmt.Sprintf("Service %s through ipBlock %v", s, block))
			}
		}
	}
	return out
}
