//go:build linux

package chartcheck

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir = "../../deploy/helm/telorunner"
	// roleFile is the one place the driver's Role rules live; the chart must
	// ship exactly these.
	roleFile = "../../deploy/kubernetes/role.yaml"
)

// install is one `helm install <release> deploy/helm/telorunner -n
// <namespace> -f values.yaml`, with what that should produce.
type install struct {
	name      string
	release   string
	namespace string
	values    string // YAML, as a -f file; "" = the chart's defaults
	want      want
}

// want is what the release must contain, stated independently of the
// templates (from the values a user sets, or the documented defaults).
type want struct {
	sessionNS       string
	createSessionNS bool
	managedBy       string
	imagePrefix     string // "<image.repository>/"; the tag is tag or appVersion
	tag             string // "" = the chart's appVersion
	pullPolicy      string
	natsURL         string // "" = the chart runs NATS itself
	kernelImage     string
	workspaceImage  string // "" = <imagePrefix>workspace-server:<tag>
	apiEdgeReplicas int64
	apiEdgePort     int64
	// noSessionGuards: the session NetworkPolicy and ResourceQuota are
	// switched off; ingressNS is the ingress controller's namespace.
	noSessionGuards bool
	ingressNS       string
	// env the containers must carry besides the above, by component.
	env map[string]map[string]string
}

var installs = []install{
	{
		name: "defaults", release: "telo", namespace: "telorunner",
		want: want{
			sessionNS: "telo-sessions", createSessionNS: true, managedBy: "telo-k8s-runner",
			imagePrefix: "ghcr.io/telorunner/", pullPolicy: "IfNotPresent",
			kernelImage: "telorun/node:latest-slim", apiEdgeReplicas: 2, apiEdgePort: 8080,
			env: map[string]map[string]string{
				"api-edge": {"LOG_LEVEL": "info", "RUNNER_MAX_SESSIONS": "32"},
				"pod-driver": {
					"RUNNER_WATCH_MAX_TTL_SECONDS": "21600", "RUNNER_MAX_TTL_SECONDS": "3600", "RUNNER_APP_MAX_TTL_SECONDS": "21600",
					"RUNNER_MAX_CPU": "50m", "RUNNER_APP_MAX_MEMORY": "512Mi", "SESSION_INGRESS_BASE_DOMAIN": "",
				},
			},
		},
	},
	{
		name: "overrides", release: "edge", namespace: "telo-system",
		values: `
image: {repository: registry.example.com/telo, tag: "1.2.3", pullPolicy: Always}
logLevel: debug
nats: {url: "nats://nats.shared.svc:4222"}
apiEdge: {replicas: 3, port: 9090, corsOrigins: "https://editor.example.com", maxSessions: 64}
sessionNamespace: custom-sessions
managedBy: custom-runner
session:
  kernelImage: registry.example.com/kernel:9
  workspaceImage: registry.example.com/ws:7
  runtimeClass: gvisor
  imagePullSecret: pull
  watchMaxTTLSeconds: 2592000
sessionIngress: {baseDomain: sessions.example.com, className: nginx, tlsSecret: wildcard}
sessionNetworkPolicy: {ingressControllerNamespace: ingress-nginx}
limits: {cpu: 100m, memory: 200Mi, ephemeralStorage: 1Gi, ttlSeconds: 1209600}
appLimits: {cpu: "2", memory: 4Gi, ephemeralStorage: 10Gi, ttlSeconds: 2592000}
`,
		want: want{
			sessionNS: "custom-sessions", createSessionNS: true, managedBy: "custom-runner",
			imagePrefix: "registry.example.com/telo/", tag: "1.2.3", pullPolicy: "Always",
			natsURL: "nats://nats.shared.svc:4222", kernelImage: "registry.example.com/kernel:9",
			workspaceImage: "registry.example.com/ws:7", apiEdgeReplicas: 3, apiEdgePort: 9090, ingressNS: "ingress-nginx",
			env: map[string]map[string]string{
				"api-edge":   {"LOG_LEVEL": "debug", "RUNNER_MAX_SESSIONS": "64", "RUNNER_CORS_ORIGINS": "https://editor.example.com"},
				"supervisor": {"LOG_LEVEL": "debug"},
				"pod-driver": {
					// Integers past 1e6 too: Helm reads values as float64,
					// which print as 2.592e+06 unless the chart converts them.
					"RUNNER_WATCH_MAX_TTL_SECONDS": "2592000", "RUNNER_MAX_TTL_SECONDS": "1209600", "RUNNER_APP_MAX_TTL_SECONDS": "2592000",
					"RUNNER_MAX_CPU": "100m", "RUNNER_MAX_MEMORY": "200Mi", "RUNNER_MAX_EPHEMERAL_STORAGE": "1Gi",
					"RUNNER_APP_MAX_CPU": "2", "RUNNER_APP_MAX_MEMORY": "4Gi", "RUNNER_APP_MAX_EPHEMERAL_STORAGE": "10Gi",
					"RUNNER_RUNTIME_CLASS": "gvisor", "RUNNER_IMAGE_PULL_SECRET": "pull",
					"SESSION_INGRESS_BASE_DOMAIN": "sessions.example.com", "SESSION_INGRESS_CLASS": "nginx", "SESSION_INGRESS_TLS_SECRET": "wildcard",
				},
			},
		},
	},
	{
		// The session namespace exists already (kubetest's telo-sessions);
		// the chart only binds the Role there.
		name: "existing-session-namespace", release: "third", namespace: "runner",
		values: "createSessionNamespace: false\nsessionNetworkPolicy: {enabled: false}\nsessionQuota: {enabled: false}\n",
		want: want{
			noSessionGuards: true,
			sessionNS:       "telo-sessions", managedBy: "telo-k8s-runner",
			imagePrefix: "ghcr.io/telorunner/", pullPolicy: "IfNotPresent",
			kernelImage: "telorun/node:latest-slim", apiEdgeReplicas: 2, apiEdgePort: 8080,
		},
	},
}

// components are the four services, each a Deployment.
var components = []string{"api-edge", "pod-driver", "supervisor", "workspace-proxy"}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart %s: %v", chartDir, err)
	}
	return ch
}

func (in install) overrides(t testing.TB) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(in.values))
	if err != nil {
		t.Fatalf("%s: parse values: %v", in.name, err)
	}
	return v
}

// render renders ch as `helm install` would for in (strict: a reference to
// a value that does not exist fails, as in `helm lint --strict`) and returns
// the objects in Helm's install order. Hooks are refused: the chart has none
// and the checks below would not see them.
func render(ch *chart.Chart, in install, overrides map[string]any, caps *chartutil.Capabilities, strict bool) ([]*unstructured.Unstructured, error) {
	opts := chartutil.ReleaseOptions{Name: in.release, Namespace: in.namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, overrides, opts, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Engine{Strict: strict}.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("split manifests: %w", err)
	}
	if len(hooks) > 0 {
		return nil, fmt.Errorf("chart has %d hooks (first in %s); chartcheck does not check hooks yet", len(hooks), hooks[0].Path)
	}
	var objs []*unstructured.Unstructured
	for _, m := range manifests {
		js, err := sigsyaml.YAMLToJSONStrict([]byte(m.Content))
		if err != nil {
			return nil, fmt.Errorf("%s: decode YAML: %w\n%s", m.Name, err, m.Content)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // a document of only comments: helm sends nothing
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: decode object: %w\n%s", m.Name, err, m.Content)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

func mustRender(t testing.TB, ch *chart.Chart, in install, caps *chartutil.Capabilities) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(ch, in, in.overrides(t), caps, true)
	if err != nil {
		t.Fatalf("%s: %v", in.name, err)
	}
	return objs
}

// roleRules is the rules list of roleFile, as generic JSON values.
func roleRules(t testing.TB) []any {
	t.Helper()
	data, err := os.ReadFile(roleFile)
	if err != nil {
		t.Fatal(err)
	}
	var role map[string]any
	if err := sigsyaml.UnmarshalStrict(data, &role); err != nil {
		t.Fatalf("%s: %v", roleFile, err)
	}
	rules, ok := role["rules"].([]any)
	if !ok || len(rules) == 0 {
		t.Fatalf("%s: no rules", roleFile)
	}
	return rules
}

// failer is *testing.T, or a collector for the tests that prove the checks
// catch a broken chart.
type failer interface {
	Helper()
	Errorf(format string, args ...any)
}

func key(kind, namespace, name string) string { return kind + " " + namespace + "/" + name }

// checkObjects asserts the release's objects for in: exactly the expected
// kinds and names, the Role's rules equal roleFile's, the RoleBinding binds
// them to the ServiceAccount the chart creates, which the pod-driver
// Deployment (only it) runs as, and the workloads carry the values.
func checkObjects(f failer, ch *chart.Chart, objs []*unstructured.Unstructured, in install, rules []any) {
	f.Helper()
	w := in.want
	rel := in.release
	sa := rel + "-pod-driver"
	natsURL := w.natsURL
	if natsURL == "" {
		natsURL = "nats://" + rel + "-nats:4222"
	}
	tag := w.tag
	if tag == "" {
		tag = ch.Metadata.AppVersion
	}
	workspaceImage := w.workspaceImage
	if workspaceImage == "" {
		workspaceImage = w.imagePrefix + "workspace-server:" + tag
	}

	// The object set. Namespaced objects without metadata.namespace go to
	// the release namespace ("" here). No ClusterRole: 11.16's namespaces
	// get/list is for the reference's namespace probe, and the driver never
	// reads namespaces, so the chart grants nothing cluster-wide.
	wantKeys := []string{
		key("ServiceAccount", "", sa),
		key("Role", w.sessionNS, rel+"-driver"),
		key("RoleBinding", w.sessionNS, rel+"-driver"),
		key("Service", "", rel+"-api-edge"),
	}
	if w.createSessionNS {
		wantKeys = append(wantKeys, key("Namespace", "", w.sessionNS))
	}
	if !w.noSessionGuards {
		wantKeys = append(wantKeys, key("NetworkPolicy", w.sessionNS, rel+"-sessions"), key("ResourceQuota", w.sessionNS, rel+"-sessions"))
	}
	for _, c := range components {
		wantKeys = append(wantKeys, key("Deployment", "", rel+"-"+c))
	}
	if w.natsURL == "" {
		wantKeys = append(wantKeys, key("Service", "", rel+"-nats"), key("StatefulSet", "", rel+"-nats"))
	}
	byKey := map[string]*unstructured.Unstructured{}
	var gotKeys []string
	for _, o := range objs {
		k := key(o.GetKind(), o.GetNamespace(), o.GetName())
		if _, dup := byKey[k]; dup {
			f.Errorf("%s: %s rendered twice", in.name, k)
		}
		byKey[k] = o
		gotKeys = append(gotKeys, k)
	}
	sort.Strings(wantKeys)
	sort.Strings(gotKeys)
	if !slices.Equal(gotKeys, wantKeys) {
		f.Errorf("%s: rendered objects\n  %s\nwant\n  %s", in.name, strings.Join(gotKeys, "\n  "), strings.Join(wantKeys, "\n  "))
	}
	get := func(kind, ns, name string) *unstructured.Unstructured {
		o := byKey[key(kind, ns, name)]
		if o == nil {
			f.Errorf("%s: no %s", in.name, key(kind, ns, name))
		}
		return o
	}

	for _, o := range objs {
		if l := o.GetLabels(); l["app.kubernetes.io/instance"] != rel || l["app.kubernetes.io/name"] != "telorunner" {
			f.Errorf("%s: %s %s labels %v lack the release's name/instance labels", in.name, o.GetKind(), o.GetName(), l)
		}
	}

	if w.createSessionNS {
		if ns := get("Namespace", "", w.sessionNS); ns != nil {
			l := ns.GetLabels()
			for _, k := range []string{"pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/warn"} {
				if l[k] != "restricted" {
					f.Errorf("%s: session namespace label %s = %q, want restricted (11.17)", in.name, k, l[k])
				}
			}
		}
	}

	if !w.noSessionGuards {
		checkSessionGuards(f, in, get("NetworkPolicy", w.sessionNS, rel+"-sessions"), get("ResourceQuota", w.sessionNS, rel+"-sessions"))
	}

	if role := get("Role", w.sessionNS, rel+"-driver"); role != nil {
		if got := role.Object["rules"]; !reflect.DeepEqual(got, any(rules)) {
			f.Errorf("%s: Role rules differ from %s\n got: %s\nwant: %s", in.name, roleFile, yamlOf(got), yamlOf(rules))
		}
	}
	if rb := get("RoleBinding", w.sessionNS, rel+"-driver"); rb != nil {
		wantRef := map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rel + "-driver"}
		if got := rb.Object["roleRef"]; !reflect.DeepEqual(got, any(wantRef)) {
			f.Errorf("%s: RoleBinding roleRef = %s, want %s", in.name, yamlOf(got), yamlOf(wantRef))
		}
		wantSubj := []any{map[string]any{"kind": "ServiceAccount", "name": sa, "namespace": in.namespace}}
		if got := rb.Object["subjects"]; !reflect.DeepEqual(got, any(wantSubj)) {
			f.Errorf("%s: RoleBinding subjects = %s, want the chart's ServiceAccount %s", in.name, yamlOf(got), yamlOf(wantSubj))
		}
	}

	for _, c := range components {
		d := get("Deployment", "", rel+"-"+c)
		if d == nil {
			continue
		}
		pod := nested(f, d, "spec", "template", "spec")
		podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		sel, _, _ := unstructured.NestedStringMap(d.Object, "spec", "selector", "matchLabels")
		if sel["app.kubernetes.io/component"] != c || sel["app.kubernetes.io/instance"] != rel || !subset(sel, podLabels) {
			f.Errorf("%s: Deployment %s selector %v does not select its own pods %v by component and instance", in.name, c, sel, podLabels)
		}
		saName, _, _ := unstructured.NestedString(pod, "serviceAccountName")
		automount, hasAutomount, _ := unstructured.NestedBool(pod, "automountServiceAccountToken")
		if c == "pod-driver" {
			if byKey[key("ServiceAccount", "", saName)] == nil || saName != sa || (hasAutomount && !automount) {
				f.Errorf("%s: pod-driver runs as ServiceAccount %q (automount %v, set %v), want the one the chart creates and binds, %q, with its token mounted", in.name, saName, automount, hasAutomount, sa)
			}
		} else if saName != "" || !hasAutomount || automount {
			f.Errorf("%s: %s has serviceAccountName %q, automountServiceAccountToken %v (set %v); only the driver talks to the API", in.name, c, saName, automount, hasAutomount)
		}
		containers, _, _ := unstructured.NestedSlice(pod, "containers")
		if len(containers) != 1 {
			f.Errorf("%s: %s has %d containers, want 1", in.name, c, len(containers))
			continue
		}
		ctr, _ := containers[0].(map[string]any)
		if img := ctr["image"]; img != w.imagePrefix+c+":"+tag {
			f.Errorf("%s: %s image %v, want %s", in.name, c, img, w.imagePrefix+c+":"+tag)
		}
		if pp := ctr["imagePullPolicy"]; pp != w.pullPolicy {
			f.Errorf("%s: %s imagePullPolicy %v, want %s", in.name, c, pp, w.pullPolicy)
		}
		env := envOf(f, in.name+": "+c, ctr)
		for k, v := range env {
			if isIntEnv(k) && !decimal.MatchString(v) {
				f.Errorf("%s: %s env %s = %q, want a decimal integer (the services parse it with strconv)", in.name, c, k, v)
			}
		}
		writable := writableDirs(f, in.name+": "+c, pod, ctr)
		wantEnv := map[string]string{"RUNNER_NATS_URL": natsURL}
		maps.Copy(wantEnv, w.env[c])
		switch c {
		case "api-edge":
			wantEnv["PORT"] = fmt.Sprint(w.apiEdgePort)
			if r, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); r != w.apiEdgeReplicas {
				f.Errorf("%s: api-edge replicas %d, want %d", in.name, r, w.apiEdgeReplicas)
			}
		case "pod-driver":
			wantEnv["RUNNER_BACKEND"] = "kubernetes"
			wantEnv["RUNNER_SESSION_NAMESPACE"] = w.sessionNS
			wantEnv["RUNNER_MANAGED_BY"] = w.managedBy
			wantEnv["RUNNER_IMAGE"] = w.kernelImage
			wantEnv["RUNNER_WORKSPACE_IMAGE"] = workspaceImage
			// The driver creates RUNNER_WORK_DIR at boot whatever the
			// backend (driver.Run); unset it is .telorunner/sessions under
			// the image's working directory, on the read-only root.
			if wd := env["RUNNER_WORK_DIR"]; !underAny(wd, writable) {
				f.Errorf("%s: pod-driver RUNNER_WORK_DIR = %q is not under a writable volume mount %v", in.name, wd, writable)
			}
		}
		for k, v := range wantEnv {
			if got, ok := env[k]; !ok || got != v {
				f.Errorf("%s: %s env %s = %q (set %v), want %q", in.name, c, k, got, ok, v)
			}
		}
	}

	// The api-edge Service reaches the api-edge pods on their named port.
	if svc, d := get("Service", "", rel+"-api-edge"), get("Deployment", "", rel+"-api-edge"); svc != nil && d != nil {
		checkService(f, in.name, svc, d, "http")
	}
	if w.natsURL == "" {
		svc, sts := get("Service", "", rel+"-nats"), get("StatefulSet", "", rel+"-nats")
		if svc != nil && sts != nil {
			checkService(f, in.name, svc, sts, "client")
			// A non-root pod can only write a fresh volume that its
			// fsGroup owns.
			claims, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
			fsGroup, ok, _ := unstructured.NestedInt64(sts.Object, "spec", "template", "spec", "securityContext", "fsGroup")
			if len(claims) > 0 && (!ok || fsGroup == 0) {
				f.Errorf("%s: NATS StatefulSet mounts a PersistentVolumeClaim as a non-root user without a pod fsGroup", in.name)
			}
			if sn, _, _ := unstructured.NestedString(sts.Object, "spec", "serviceName"); sn != svc.GetName() {
				f.Errorf("%s: NATS StatefulSet serviceName %q, want its Service %q", in.name, sn, svc.GetName())
			}
		}
	}
}

// checkService asserts svc selects workload's pods and targets a port the
// workload's container names portName.
// checkSessionGuards asserts the session NetworkPolicy and ResourceQuota
// of 11.17: the policy selects pods by the configured managed-by value
// (19 item 26), admits ingress only from the release namespace (and the
// ingress controller's), and lets egress reach DNS, the release namespace
// and anything outside the blocked CIDRs.
func checkSessionGuards(f failer, in install, np, quota *unstructured.Unstructured) {
	f.Helper()
	w := in.want
	if np != nil {
		spec := nested(f, np, "spec")
		wantSel := map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/managed-by": w.managedBy}}
		if !reflect.DeepEqual(spec["podSelector"], any(wantSel)) {
			f.Errorf("%s: NetworkPolicy podSelector = %s, want %s", in.name, yamlOf(spec["podSelector"]), yamlOf(wantSel))
		}
		nsSel := func(ns string) any {
			return map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}}}
		}
		from := []any{nsSel(in.namespace)}
		if w.ingressNS != "" {
			from = append(from, nsSel(w.ingressNS))
		}
		wantIngress := []any{map[string]any{"from": from}}
		if !reflect.DeepEqual(spec["ingress"], any(wantIngress)) {
			f.Errorf("%s: NetworkPolicy ingress = %s, want %s", in.name, yamlOf(spec["ingress"]), yamlOf(wantIngress))
		}
		wantEgress := []any{
			map[string]any{"to": []any{nsSel("kube-system")}, "ports": []any{
				map[string]any{"protocol": "UDP", "port": int64(53)}, map[string]any{"protocol": "TCP", "port": int64(53)}}},
			map[string]any{"to": []any{nsSel(in.namespace)}},
			map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0",
				"except": []any{"169.254.169.254/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}}}}},
		}
		if !reflect.DeepEqual(spec["egress"], any(wantEgress)) {
			f.Errorf("%s: NetworkPolicy egress = %s, want %s", in.name, yamlOf(spec["egress"]), yamlOf(wantEgress))
		}
	}
	if quota != nil {
		wantHard := map[string]any{"pods": "32", "limits.cpu": "4", "limits.memory": "8Gi", "requests.cpu": "2", "requests.memory": "4Gi"}
		if got := nested(f, quota, "spec")["hard"]; !reflect.DeepEqual(got, any(wantHard)) {
			f.Errorf("%s: ResourceQuota hard = %s, want %s", in.name, yamlOf(got), yamlOf(wantHard))
		}
	}
}

func checkService(f failer, name string, svc, workload *unstructured.Unstructured, portName string) {
	f.Helper()
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	podLabels, _, _ := unstructured.NestedStringMap(workload.Object, "spec", "template", "metadata", "labels")
	if len(sel) == 0 || !subset(sel, podLabels) {
		f.Errorf("%s: Service %s selector %v does not select %s's pods %v", name, svc.GetName(), sel, workload.GetName(), podLabels)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	named := map[string]bool{}
	containers, _, _ := unstructured.NestedSlice(workload.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		cps, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
		for _, p := range cps {
			if n, ok := p.(map[string]any)["name"].(string); ok {
				named[n] = true
			}
			if n, ok := p.(map[string]any)["containerPort"].(int64); ok {
				named[fmt.Sprint(n)] = true
			}
		}
	}
	if !named[portName] {
		f.Errorf("%s: %s has no container port named %q", name, workload.GetName(), portName)
	}
	if len(ports) == 0 {
		f.Errorf("%s: Service %s has no ports", name, svc.GetName())
	}
	for _, p := range ports {
		tp := fmt.Sprint(p.(map[string]any)["targetPort"])
		if !named[tp] {
			f.Errorf("%s: Service %s targetPort %s is not a port of %s (%v)", name, svc.GetName(), tp, workload.GetName(), named)
		}
	}
}

func nested(f failer, o *unstructured.Unstructured, path ...string) map[string]any {
	f.Helper()
	m, ok, err := unstructured.NestedMap(o.Object, path...)
	if err != nil || !ok {
		f.Errorf("%s %s: no %s (%v)", o.GetKind(), o.GetName(), strings.Join(path, "."), err)
		return map[string]any{}
	}
	return m
}

// envOf is a container's literal env; a name given twice is an error.
func envOf(f failer, what string, ctr map[string]any) map[string]string {
	f.Helper()
	env := map[string]string{}
	list, _ := ctr["env"].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		name, _ := m["name"].(string)
		if _, dup := env[name]; dup {
			f.Errorf("%s: env %s set twice", what, name)
		}
		v, ok := m["value"].(string)
		if !ok && m["value"] != nil {
			f.Errorf("%s: env %s value %v is not a string", what, name, m["value"])
		}
		env[name] = v
	}
	return env
}

// decimal is what strconv.Atoi/ParseInt accept (no exponent).
var decimal = regexp.MustCompile(`^-?[0-9]+$`)

// isIntEnv names the integer settings the services read.
func isIntEnv(name string) bool {
	if name == "PORT" {
		return true
	}
	for _, s := range []string{"_SECONDS", "_SESSIONS", "_BYTES", "_MS", "_LIMIT"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// writableDirs are the mount paths of the container's writable volumes,
// and "/" when its root filesystem is writable.
func writableDirs(f failer, what string, pod, ctr map[string]any) []string {
	f.Helper()
	var dirs []string
	if ro, _, _ := unstructured.NestedBool(ctr, "securityContext", "readOnlyRootFilesystem"); !ro {
		dirs = append(dirs, "/")
	}
	vols, _, _ := unstructured.NestedSlice(pod, "volumes")
	known := map[string]bool{}
	for _, v := range vols {
		if n, ok := v.(map[string]any)["name"].(string); ok {
			known[n] = true
		}
	}
	mounts, _, _ := unstructured.NestedSlice(ctr, "volumeMounts")
	for _, m := range mounts {
		mm := m.(map[string]any)
		name, _ := mm["name"].(string)
		if !known[name] {
			f.Errorf("%s: volumeMount %q has no volume", what, name)
		}
		if ro, _ := mm["readOnly"].(bool); !ro {
			p, _ := mm["mountPath"].(string)
			dirs = append(dirs, p)
		}
	}
	return dirs
}

// underAny reports whether the absolute path p is one of dirs or below one.
func underAny(p string, dirs []string) bool {
	if !path.IsAbs(p) {
		return false
	}
	p = path.Clean(p)
	for _, d := range dirs {
		d = path.Clean(d)
		if p == d || d == "/" || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func subset(a, b map[string]string) bool {
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func yamlOf(v any) string {
	b, err := sigsyaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return "\n" + string(b)
}

// TestChartRenders renders every install with Helm's default capabilities,
// lints the chart with its values and checks the objects.
func TestChartRenders(t *testing.T) {
	rules := roleRules(t)
	for _, in := range installs {
		t.Run(in.name, func(t *testing.T) {
			ch := loadChart(t)
			objs := mustRender(t, ch, in, chartutil.DefaultCapabilities)
			checkObjects(t, ch, objs, in, rules)

			l := lint.All(chartDir, in.overrides(t), in.namespace, true)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %v", m)
				} else {
					t.Logf("helm lint: %v", m)
				}
			}
		})
	}
}

// collector records failures instead of failing the test.
type collector struct{ errs []string }

func (c *collector) Helper() {}
func (c *collector) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// replaceFile swaps the data of a chart file or template; it fails when
// there is no such file (so the test does not pass by testing nothing).
func replaceFile(t *testing.T, ch *chart.Chart, name string, edit func(string) string) {
	t.Helper()
	for _, list := range [][]*chart.File{ch.Files, ch.Templates} {
		for _, f := range list {
			if f.Name == name {
				before := string(f.Data)
				f.Data = []byte(edit(before))
				if string(f.Data) == before {
					t.Fatalf("edit of %s changed nothing", name)
				}
				return
			}
		}
	}
	t.Fatalf("chart has no file %s", name)
}

// TestChecksCatchBrokenCharts breaks a loaded chart in memory in ways the
// checks exist for and asserts they notice.
func TestChecksCatchBrokenCharts(t *testing.T) {
	rules := roleRules(t)
	in := installs[0]

	t.Run("role file missing", func(t *testing.T) {
		// A chart packaged without files/role.yaml (say, the symlink was
		// dropped) must not install a Role without rules: non-strict
		// rendering, as `helm install` does, has to fail.
		ch := loadChart(t)
		n := len(ch.Files)
		ch.Files = slices.DeleteFunc(ch.Files, func(f *chart.File) bool { return f.Name == "files/role.yaml" })
		if len(ch.Files) != n-1 {
			t.Fatalf("chart has no files/role.yaml")
		}
		_, err := render(ch, in, nil, chartutil.DefaultCapabilities, false)
		if err == nil || !strings.Contains(err.Error(), "role.yaml") {
			t.Fatalf("render without files/role.yaml: error %v, want one naming role.yaml", err)
		}
	})

	for _, tc := range []struct {
		name, file string
		edit       func(string) string
		want       string
		install    int // index into installs
	}{
		{"rule dropped", "files/role.yaml", func(s string) string {
			return strings.Replace(s, `verbs: ["get", "create", "update", "list", "delete"]`, `verbs: ["get", "create", "update", "list"]`, 1)
		}, "Role rules differ", 0},
		{"service account renamed", "templates/serviceaccount.yaml", func(s string) string {
			return strings.Replace(s, "-pod-driver", "-driver-sa", 1)
		}, "pod-driver runs as ServiceAccount", 0},
		{"service account not created", "templates/serviceaccount.yaml", func(s string) string {
			return "{{- /* dropped */ -}}\n"
		}, "pod-driver runs as ServiceAccount", 0},
		{"binding to the wrong namespace", "templates/role.yaml", func(s string) string {
			return strings.Replace(s, "namespace: {{ .Release.Namespace }}", "namespace: {{ .Values.sessionNamespace }}", 1)
		}, "RoleBinding subjects", 0},
		{"workload without token opt-out", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "automountServiceAccountToken: false", "automountServiceAccountToken: true", 1)
		}, "only the driver talks to the API", 0},
		{"driver work dir on the read-only root", "templates/services.yaml", func(s string) string {
			return regexp.MustCompile(`(?m)^.*RUNNER_WORK_DIR.*\n`).ReplaceAllString(s, "")
		}, "RUNNER_WORK_DIR", 0},
		{"no fsGroup", "templates/_helpers.tpl", func(s string) string {
			return regexp.MustCompile(`(?m)^.*fsGroup.*\n`).ReplaceAllString(s, "")
		}, "fsGroup", 0},
		{"session policy selector hard-coded (19 item 26)", "templates/sessionnetwork.yaml", func(s string) string {
			return strings.Replace(s, "{{ .Values.managedBy | quote }}", `"telo-k8s-runner"`, 1)
		}, "NetworkPolicy podSelector", 1},
		{"session ingress open to every namespace", "templates/sessionnetwork.yaml", func(s string) string {
			return strings.Replace(s, "- namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: {{ .Release.Namespace | quote }}}}", "- namespaceSelector: {}", 1)
		}, "NetworkPolicy ingress", 0},
		{"integer printed as float", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "watchMaxTTLSeconds | int64 | quote", "watchMaxTTLSeconds | quote", 1)
		}, "want a decimal integer", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := loadChart(t)
			replaceFile(t, ch, tc.file, tc.edit)
			in := installs[tc.install]
			objs, err := render(ch, in, in.overrides(t), chartutil.DefaultCapabilities, true)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			var c collector
			checkObjects(&c, ch, objs, in, rules)
			if !slices.ContainsFunc(c.errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
				t.Fatalf("checks reported %q, want a failure containing %q", c.errs, tc.want)
			}
		})
	}
}
