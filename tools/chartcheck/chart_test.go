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
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir = "../../deploy/helm/telorunner"
	// roleFile is the one place the driver's Role rules live; the chart must
	// ship exactly these.
	roleFile = "../../deploy/kubernetes/role.yaml"
	// buildRoleFile is the one place the driver's build-namespace Role
	// rules live (the chart narrows its secrets rule to the push Secret).
	buildRoleFile = "../../deploy/kubernetes/build-role.yaml"
	// permsFile maps each bus role to its NATS permissions block.
	permsFile = chartDir + "/files/nats-permissions.json"
	// fullValues overrides every value of the chart (the "overrides"
	// install).
	fullValues = "testdata/values-full.yaml"
	seedDir    = "/var/run/secrets/telorunner/nats/"
)

// roles are the bus identities; busRole is the one each workload holds.
var (
	roles   = []string{"edge", "driver", "supervisor", "workspace-proxy", "subscriber", "provisioner"}
	busRole = map[string]string{"api-edge": "edge", "pod-driver": "driver", "supervisor": "supervisor", "workspace-proxy": "workspace-proxy", "provision": "provisioner"}
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
	natsReplicas    int64  // nodes of the chart's NATS
	streamReplicas  string // RUNNER_NATS_REPLICAS
	syncAlways      bool   // jetstream sync_interval: always
	credSecret      string // the Secret with the roles' seeds and public keys
	secrets         []string
	kernelImage     string
	workspaceImage  string // "" = <imagePrefix>workspace-server:<tag>
	replicas        map[string]int64
	apiEdgePort     int64
	opsPort         int64
	pprof           bool // RUNNER_PPROF of every service
	// noSessionGuards: the session NetworkPolicy and ResourceQuota are
	// switched off; ingressNS is the ingress controller's namespace.
	noSessionGuards bool
	ingressNS       string
	dnsNS           string
	blockedCIDRs    []any
	// extraNATSClients: NATS client peers besides the runner's pods.
	extraNATSClients []any
	noPDB            bool
	// The build namespace (contract 11.11, 11.16, 11.17): its name, whether
	// the chart creates it, the push Secret the driver may read ("" = none),
	// the build pods' policy (off, or the CIDRs it blocks).
	buildNS       string
	createBuildNS bool
	pushSecret    string
	noBuildPolicy bool
	buildBlocked  []any
	// env the containers must carry besides the above, by component;
	// "secret:<name>/<key>" is a value from a Secret.
	env map[string]map[string]string
}

var defaultBlocked = []any{"169.254.169.254/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}

var installs = []install{
	{
		name: "defaults", release: "telo", namespace: "telorunner",
		want: want{
			sessionNS: "telo-sessions", createSessionNS: true, managedBy: "telo-k8s-runner",
			imagePrefix: "ghcr.io/telorunner/", pullPolicy: "IfNotPresent", natsReplicas: 3, streamReplicas: "3", syncAlways: true,
			credSecret: "telo-nats-credentials", dnsNS: "kube-system", blockedCIDRs: defaultBlocked,
			kernelImage: "telorun/node:latest-slim", apiEdgePort: 8080, opsPort: 9090,
			buildNS: "telo-builds", createBuildNS: true, buildBlocked: []any{"169.254.169.254/32"},
			replicas: map[string]int64{"api-edge": 2, "pod-driver": 1, "supervisor": 1, "workspace-proxy": 1},
			env: map[string]map[string]string{
				"api-edge": {"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "true", "RUNNER_BASE_IMAGE_REPO": "telorun/node",
					"RUNNER_BASE_IMAGE_PINNED_ONLY": "true", "RUNNER_BASE_IMAGE_EXCLUDE_SHA": "true", "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE": "true",
					"RUNNER_BASE_IMAGE_INCLUDE": "", "RUNNER_BASE_IMAGE_EXCLUDE": "", "RUNNER_BASE_IMAGE_LIMIT": "20",
					"RUNNER_BASE_IMAGE_REFRESH_SECONDS": "3600", "RUNNER_BASE_IMAGE_API_URL": "",
					"LOG_LEVEL": "info", "LOG_FORMAT": "json", "RUNNER_MAX_SESSIONS": "32", "RUNNER_WATCH_SESSIONS": "false",
					"RUNNER_BODY_LIMIT_BYTES": "1048576", "RUNNER_WORKSPACE_MAX_BODY_BYTES": "67108864", "RUNNER_EXIT_TTL_MS": "14400000", "RUNNER_WATCH_IDLE_SECONDS": "300",
					"RUNNER_WATCH_MAX_SESSIONS": "8", "RUNNER_WATCH_RELOAD_LIMIT": "30", "RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "86400",
					"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "30", "TELO_REGISTRY_URL": "", "RUNNER_REPLAY_BUFFER_BYTES": "5000000"},
				"pod-driver": {
					"RUNNER_WATCH_MAX_TTL_SECONDS": "21600", "RUNNER_MAX_TTL_SECONDS": "3600", "RUNNER_APP_MAX_TTL_SECONDS": "21600",
					"RUNNER_MAX_CPU": "50m", "RUNNER_APP_MAX_MEMORY": "512Mi", "SESSION_INGRESS_BASE_DOMAIN": "",
					"RUNNER_RUN_START_DEADLINE_SECONDS": "120", "RUNNER_WATCH_START_DEADLINE_SECONDS": "180",
					"RUNNER_WORKSPACE_READY_SECONDS": "120", "RUNNER_RELAY_RETRY_MS": "500", "RUNNER_WORK_DIR": "/tmp/sessions",
					"RUNNER_BUILD_NAMESPACE": "telo-builds", "RUNNER_IMAGE_REPOSITORY": "", "RUNNER_BUILDER": "layer", "RUNNER_INIT_IMAGE": "",
					"RUNNER_BUILD_TIMEOUT_SECONDS": "600", "RUNNER_REGISTRY_API_URL": "", "RUNNER_REGISTRY_INSECURE": "false",
					"RUNNER_REGISTRY_PUSH_SECRET": "", "RUNNER_IMAGE_PULL_SECRET": "",
				},
				"supervisor":      {"RUNNER_EXIT_TTL_MS": "14400000", "RUNNER_WATCH_IDLE_SECONDS": "300", "RUNNER_OWNER_TTL_MS": "15000"},
				"workspace-proxy": {"RUNNER_OWNER_TTL_MS": "15000"},
			},
		},
	},
	{
		name: "overrides", release: "edge", namespace: "telo-system", values: "@" + fullValues,
		want: want{
			sessionNS: "custom-sessions", createSessionNS: true, managedBy: "custom-runner",
			imagePrefix: "registry.example.com/telo/", tag: "1.2.3", pullPolicy: "Always", natsReplicas: 5, streamReplicas: "3",
			credSecret: "bus-credentials", secrets: []string{"bus-credentials", "edge-apps", "edge-terms"},
			kernelImage: "registry.example.com/kernel:9", workspaceImage: "registry.example.com/ws:7",
			apiEdgePort: 9090, opsPort: 9191, pprof: true, ingressNS: "ingress-nginx", dnsNS: "dns-system",
			buildNS: "custom-builds", createBuildNS: true, pushSecret: "push", buildBlocked: []any{"169.254.169.254/32", "10.0.0.0/8"},
			blockedCIDRs: append(slices.Clone(defaultBlocked), "198.18.0.0/15"),
			extraNATSClients: []any{map[string]any{
				"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "audit"}},
				"podSelector":       map[string]any{"matchLabels": map[string]any{"app": "event-reader"}}}},
			replicas: map[string]int64{"api-edge": 3, "pod-driver": 2, "supervisor": 2, "workspace-proxy": 2},
			env: map[string]map[string]string{
				"api-edge": {"LOG_LEVEL": "debug", "LOG_FORMAT": "text", "RUNNER_MAX_SESSIONS": "64", "RUNNER_CORS_ORIGINS": "https://editor.example.com",
					"RUNNER_BODY_LIMIT_BYTES": "4194304", "RUNNER_WORKSPACE_MAX_BODY_BYTES": "134217728", "RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_MAX_SESSIONS": "16",
					"RUNNER_WATCH_RELOAD_LIMIT": "60", "RUNNER_WATCH_IDLE_SECONDS": "600", "RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "172800",
					"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "15", "RUNNER_WATCH_MAX_TTL_SECONDS": "2592000", "RUNNER_EXIT_TTL_MS": "3600000",
					"RUNNER_REPLAY_BUFFER_BYTES": "10000000", "TELO_REGISTRY_URL": "https://registry.example.com/telo-modules",
					"RUNNER_APPS": "secret:edge-apps/catalog.json", "RUNNER_TERMS_TITLE": "Terms of use", "RUNNER_TERMS_VERSION": "2026-12",
					"RUNNER_TERMS_FILE":                 "/etc/telorunner/terms/agreement.md",
					"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false", "RUNNER_BASE_IMAGE_REPO": "acme/kernel",
					"RUNNER_BASE_IMAGE_PINNED_ONLY": "false", "RUNNER_BASE_IMAGE_EXCLUDE_SHA": "false", "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE": "false",
					"RUNNER_BASE_IMAGE_INCLUDE": "-slim$", "RUNNER_BASE_IMAGE_EXCLUDE": `^0\.`, "RUNNER_BASE_IMAGE_LIMIT": "5",
					"RUNNER_BASE_IMAGE_REFRESH_SECONDS": "1209600", "RUNNER_BASE_IMAGE_API_URL": "https://hub-mirror.example.com"},
				"supervisor": {"LOG_LEVEL": "debug", "RUNNER_EXIT_TTL_MS": "3600000", "RUNNER_OWNER_TTL_MS": "30000", "RUNNER_WATCH_IDLE_SECONDS": "600",
					"RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "172800", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "15"},
				"pod-driver": {
					// Integers past 1e6 too: Helm reads values as float64,
					// which print as 2.592e+06 unless the chart converts them.
					"RUNNER_WATCH_MAX_TTL_SECONDS": "2592000", "RUNNER_MAX_TTL_SECONDS": "1209600", "RUNNER_APP_MAX_TTL_SECONDS": "2592000",
					"RUNNER_MAX_CPU": "100m", "RUNNER_MAX_MEMORY": "200Mi", "RUNNER_MAX_EPHEMERAL_STORAGE": "1Gi",
					"RUNNER_APP_MAX_CPU": "2", "RUNNER_APP_MAX_MEMORY": "4Gi", "RUNNER_APP_MAX_EPHEMERAL_STORAGE": "10Gi",
					"RUNNER_RUNTIME_CLASS": "gvisor", "RUNNER_IMAGE_PULL_SECRET": "pull",
					"SESSION_INGRESS_BASE_DOMAIN": "sessions.example.com", "SESSION_INGRESS_CLASS": "nginx", "SESSION_INGRESS_TLS_SECRET": "wildcard",
					"RUNNER_APPS": "secret:edge-apps/catalog.json", "TELO_REGISTRY_URL": "https://registry.example.com/telo-modules",
					"RUNNER_REPLAY_BUFFER_BYTES": "10000000", "RUNNER_BACKEND": "local", "RUNNER_KERNEL_COMMAND": "/opt/telo/bin/telo",
					"RUNNER_DATA_DIR": "/tmp/data", "RUNNER_WORK_DIR": "/tmp/work", "RUNNER_DRIVER_ID": "driver-a", "RUNNER_OWNER_TTL_MS": "30000",
					"RUNNER_RUN_START_DEADLINE_SECONDS": "240", "RUNNER_WATCH_START_DEADLINE_SECONDS": "360",
					"RUNNER_WORKSPACE_READY_SECONDS": "240", "RUNNER_RELAY_RETRY_MS": "1000",
					"RUNNER_BUILD_NAMESPACE": "custom-builds", "RUNNER_IMAGE_REPOSITORY": "registry.example.com/telo/apps",
					"RUNNER_BUILDER": "kaniko", "RUNNER_BUILDER_IMAGE": "registry.example.com/kaniko:1", "RUNNER_INIT_IMAGE": "registry.example.com/busybox:1",
					"RUNNER_BUILD_TIMEOUT_SECONDS": "1800000", "RUNNER_REGISTRY_API_URL": "https://registry.example.com",
					"RUNNER_REGISTRY_INSECURE": "true", "RUNNER_REGISTRY_PUSH_SECRET": "push",
				},
			},
		},
	},
	{
		// The session namespace exists already (kubetest's telo-sessions);
		// the chart only binds the Role there. An external NATS; the terms
		// body from an existing Secret, as an environment variable.
		name: "external-nats", release: "third", namespace: "runner",
		values: `
createSessionNamespace: false
sessionNetworkPolicy: {enabled: false}
natsNetworkPolicy: {enabled: false}
sessionQuota: {enabled: false}
build: {createNamespace: false, networkPolicy: {enabled: false}}
nats: {url: "nats://nats.shared.svc:4222"}
auth: {secretName: shared-bus}
apps: {existingSecret: catalog, secretKey: apps}
terms: {enabled: true, existingSecret: agreement, secretKey: body, as: env}
apiEdge: {pdb: {enabled: false}}
podDriver: {pdb: {enabled: false}}
supervisor: {pdb: {enabled: false}}
workspaceProxy: {pdb: {enabled: false}}
`,
		want: want{
			noSessionGuards: true, noPDB: true, buildNS: "telo-builds", noBuildPolicy: true,
			sessionNS: "telo-sessions", managedBy: "telo-k8s-runner", natsURL: "nats://nats.shared.svc:4222", streamReplicas: "1",
			imagePrefix: "ghcr.io/telorunner/", pullPolicy: "IfNotPresent", credSecret: "shared-bus",
			kernelImage: "telorun/node:latest-slim", apiEdgePort: 8080, opsPort: 9090,
			replicas: map[string]int64{"api-edge": 2, "pod-driver": 1, "supervisor": 1, "workspace-proxy": 1},
			env: map[string]map[string]string{
				"api-edge":   {"RUNNER_APPS": "secret:catalog/apps", "RUNNER_TERMS_BODY": "secret:agreement/body"},
				"pod-driver": {"RUNNER_APPS": "secret:catalog/apps"},
			},
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

// testCreds are nkeys of every role, generated once per test binary.
var testCreds = func() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, r := range roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			panic(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		out[r] = map[string]string{"seed": string(seed), "publicKey": pub}
	}
	return out
}()

// valuesYAML is the install's values file ("@path" reads path), with
// AUTH_CREDENTIALS replaced by testCreds.
func (in install) valuesYAML(t testing.TB) string {
	t.Helper()
	v := in.values
	if file, ok := strings.CutPrefix(v, "@"); ok {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		v = string(data)
	}
	js, err := sigsyaml.Marshal(testCreds)
	if err != nil {
		t.Fatal(err)
	}
	flow, err := sigsyaml.YAMLToJSON(js)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(v, "AUTH_CREDENTIALS", string(flow))
}

func (in install) overrides(t testing.TB) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(in.valuesYAML(t)))
	if err != nil {
		t.Fatalf("%s: parse values: %v", in.name, err)
	}
	return v
}

// hookAnnotation marks the objects Helm runs as hooks.
const hookAnnotation = "helm.sh/hook"

// render renders ch as `helm install` would for in (strict: a reference to
// a value that does not exist fails, as in `helm lint --strict`) and returns
// the objects in Helm's install order, hooks (the provisioning Job) last.
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
	var contents []string
	for _, m := range manifests {
		contents = append(contents, m.Content)
	}
	for _, h := range hooks {
		contents = append(contents, h.Manifest)
	}
	var objs []*unstructured.Unstructured
	for _, c := range contents {
		js, err := sigsyaml.YAMLToJSONStrict([]byte(c))
		if err != nil {
			return nil, fmt.Errorf("decode YAML: %w\n%s", err, c)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // a document of only comments: helm sends nothing
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("decode object: %w\n%s", err, c)
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
// Deployment (only it) runs as, the workloads carry the values, each bus
// client holds exactly its own role's seed, probes, resources and
// disruption budgets, NATS and both network policies.
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
		key("Job", "", rel+"-provision"),
	}
	for _, s := range w.secrets {
		wantKeys = append(wantKeys, key("Secret", "", s))
	}
	if w.createSessionNS {
		wantKeys = append(wantKeys, key("Namespace", "", w.sessionNS))
	}
	wantKeys = append(wantKeys, key("Role", w.buildNS, rel+"-driver-build"), key("RoleBinding", w.buildNS, rel+"-driver-build"))
	if w.createBuildNS {
		wantKeys = append(wantKeys, key("Namespace", "", w.buildNS))
	}
	if !w.noBuildPolicy {
		wantKeys = append(wantKeys, key("NetworkPolicy", w.buildNS, rel+"-builds"))
	}
	if !w.noSessionGuards {
		wantKeys = append(wantKeys, key("NetworkPolicy", w.sessionNS, rel+"-sessions"), key("ResourceQuota", w.sessionNS, rel+"-sessions"))
	}
	for _, c := range components {
		wantKeys = append(wantKeys, key("Deployment", "", rel+"-"+c))
		if !w.noPDB {
			wantKeys = append(wantKeys, key("PodDisruptionBudget", "", rel+"-"+c))
		}
	}
	if w.natsURL == "" {
		wantKeys = append(wantKeys, key("Service", "", rel+"-nats"), key("Service", "", rel+"-nats-headless"), key("StatefulSet", "", rel+"-nats"),
			key("ConfigMap", "", rel+"-nats-config"), key("PodDisruptionBudget", "", rel+"-nats"), key("NetworkPolicy", "", rel+"-nats"))
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
	sort.Strings(gotKeys)
	sort.Strings(wantKeys)
	if !slices.Equal(gotKeys, wantKeys) {
		f.Errorf("%s: objects\n  %s\nwant\n  %s", in.name, strings.Join(gotKeys, "\n  "), strings.Join(wantKeys, "\n  "))
	}
	get := func(kind, ns, name string) *unstructured.Unstructured { return byKey[key(kind, ns, name)] }

	// Every object carries the release's labels.
	for _, o := range objs {
		l := o.GetLabels()
		if l["app.kubernetes.io/instance"] != rel || l["app.kubernetes.io/managed-by"] != "Helm" {
			f.Errorf("%s: %s %s lacks the release labels: %v", in.name, o.GetKind(), o.GetName(), l)
		}
	}

	if role := get("Role", w.sessionNS, rel+"-driver"); role != nil {
		if got := role.Object["rules"]; !reflect.DeepEqual(got, any(rules)) {
			f.Errorf("%s: Role rules differ from %s:\n got %s\nwant %s", in.name, roleFile, yamlOf(got), yamlOf(rules))
		}
	}
	if ns := get("Namespace", "", w.sessionNS); ns != nil {
		if l := ns.GetLabels(); l["pod-security.kubernetes.io/enforce"] != "restricted" {
			f.Errorf("%s: session namespace labels %v, want Pod Security restricted enforced", in.name, l)
		}
	}
	checkSessionGuards(f, in, get("NetworkPolicy", w.sessionNS, rel+"-sessions"), get("ResourceQuota", w.sessionNS, rel+"-sessions"))
	checkBuild(f, in, get("Namespace", "", w.buildNS), get("Role", w.buildNS, rel+"-driver-build"),
		get("RoleBinding", w.buildNS, rel+"-driver-build"), get("NetworkPolicy", w.buildNS, rel+"-builds"))
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

	// The workloads that connect to the bus: the four services and the
	// provisioning hook.
	clients := map[string]*unstructured.Unstructured{}
	for _, c := range components {
		if d := get("Deployment", "", rel+"-"+c); d != nil {
			clients[c] = d
		}
	}
	if j := get("Job", "", rel+"-provision"); j != nil {
		clients["provision"] = j
		hooks := strings.Split(j.GetAnnotations()[hookAnnotation], ",")
		if !slices.Contains(hooks, "post-install") || !slices.Contains(hooks, "pre-upgrade") {
			f.Errorf("%s: provisioning Job hooks %q, want post-install (NATS exists by then) and pre-upgrade", in.name, hooks)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(clients)) {
		d := clients[c]
		pod := nested(f, d, "spec", "template", "spec")
		podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		if podLabels["app.kubernetes.io/component"] != c || podLabels["app.kubernetes.io/instance"] != rel {
			f.Errorf("%s: %s pods are labelled %v, want component %s and instance %s", in.name, c, podLabels, c, rel)
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
		image := c
		if c == "provision" {
			image = "telorunner"
			if args, _, _ := unstructured.NestedStringSlice(ctr, "args"); !slices.Equal(args, []string{"provision"}) {
				f.Errorf("%s: provisioning Job args %q, want [provision]", in.name, args)
			}
		}
		if img := ctr["image"]; img != w.imagePrefix+image+":"+tag {
			f.Errorf("%s: %s image %v, want %s", in.name, c, img, w.imagePrefix+image+":"+tag)
		}
		if pp := ctr["imagePullPolicy"]; pp != w.pullPolicy {
			f.Errorf("%s: %s imagePullPolicy %v, want %s", in.name, c, pp, w.pullPolicy)
		}
		if lim, _, _ := unstructured.NestedString(ctr, "resources", "limits", "memory"); lim == "" {
			f.Errorf("%s: %s has no memory limit", in.name, c)
		}
		env := envOf(f, in.name+": "+c, ctr)
		for k, v := range env {
			if isIntEnv(k) && !decimal.MatchString(v) {
				f.Errorf("%s: %s env %s = %q, want a decimal integer (the services parse it with strconv)", in.name, c, k, v)
			}
		}
		checkSeed(f, in, c, pod, ctr, env)
		writable := writableDirs(f, in.name+": "+c, pod, ctr)
		wantEnv := map[string]string{"RUNNER_NATS_URL": natsURL, "RUNNER_NATS_REPLICAS": w.streamReplicas}
		maps.Copy(wantEnv, w.env[c])
		if c == "provision" {
			continue
		}
		if r, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); r != w.replicas[c] {
			f.Errorf("%s: %s replicas %d, want %d", in.name, c, r, w.replicas[c])
		}
		probePort := "ops"
		switch c {
		case "api-edge":
			probePort = "http"
			wantEnv["PORT"] = fmt.Sprint(w.apiEdgePort)
			// The edge validates the kernel image against its own
			// RUNNER_IMAGE: without it the built-in default wins.
			wantEnv["RUNNER_IMAGE"] = w.kernelImage
		case "pod-driver":
			if _, ok := w.env[c]["RUNNER_BACKEND"]; !ok {
				wantEnv["RUNNER_BACKEND"] = "kubernetes"
			}
			wantEnv["RUNNER_SESSION_NAMESPACE"] = w.sessionNS
			wantEnv["RUNNER_MANAGED_BY"] = w.managedBy
			wantEnv["RUNNER_IMAGE"] = w.kernelImage
			wantEnv["RUNNER_WORKSPACE_IMAGE"] = workspaceImage
			// The layer builder's push container is the chart's own
			// telo-layer image unless build.builderImage names one.
			if _, ok := w.env[c]["RUNNER_BUILDER_IMAGE"]; !ok {
				wantEnv["RUNNER_BUILDER_IMAGE"] = w.imagePrefix + "telo-layer:" + tag
			}
			// The driver creates RUNNER_WORK_DIR at boot whatever the
			// backend (driver.Run); unset it is .telorunner/sessions under
			// the image's working directory, on the read-only root.
			for _, dv := range []string{"RUNNER_WORK_DIR", "RUNNER_DATA_DIR"} {
				if wd := env[dv]; !underAny(wd, writable) {
					f.Errorf("%s: pod-driver %s = %q is not under a writable volume mount %v", in.name, dv, wd, writable)
				}
			}
		}
		if c != "api-edge" {
			wantEnv["RUNNER_OPS_ADDR"] = fmt.Sprintf(":%d", w.opsPort)
		}
		wantEnv["RUNNER_PPROF"] = strconv.FormatBool(w.pprof)
		checkProbes(f, in.name+": "+c, ctr, probePort, map[string]int64{"http": w.apiEdgePort, "ops": w.opsPort}[probePort])
		for k, v := range wantEnv {
			if got, ok := env[k]; !ok || got != v {
				f.Errorf("%s: %s env %s = %q (set %v), want %q", in.name, c, k, got, ok, v)
			}
		}
		if pdb := get("PodDisruptionBudget", "", rel+"-"+c); pdb != nil {
			checkSelects(f, in.name, pdb, "spec", "selector", d)
		}
	}
	if d := clients["api-edge"]; d != nil {
		ctr := firstContainer(d)
		if env := envOf(f, "api-edge", ctr); env["RUNNER_TERMS_FILE"] != "" {
			if !underAny(env["RUNNER_TERMS_FILE"], mountDirs(ctr)) {
				f.Errorf("%s: RUNNER_TERMS_FILE %s is not on a mounted volume", in.name, env["RUNNER_TERMS_FILE"])
			}
		}
	}

	// The api-edge Service reaches the api-edge pods on their named port.
	if svc, d := get("Service", "", rel+"-api-edge"), get("Deployment", "", rel+"-api-edge"); svc != nil && d != nil {
		checkService(f, in.name, svc, d, "http")
	}
	if w.natsURL == "" {
		svc, headless, sts := get("Service", "", rel+"-nats"), get("Service", "", rel+"-nats-headless"), get("StatefulSet", "", rel+"-nats")
		if svc != nil && sts != nil && headless != nil {
			checkService(f, in.name, svc, sts, "client")
			checkService(f, in.name, headless, sts, "cluster")
			// A non-root pod can only write a fresh volume that its
			// fsGroup owns.
			claims, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
			fsGroup, ok, _ := unstructured.NestedInt64(sts.Object, "spec", "template", "spec", "securityContext", "fsGroup")
			if len(claims) > 0 && (!ok || fsGroup == 0) {
				f.Errorf("%s: NATS StatefulSet mounts a PersistentVolumeClaim as a non-root user without a pod fsGroup", in.name)
			}
			if sn, _, _ := unstructured.NestedString(sts.Object, "spec", "serviceName"); sn != headless.GetName() {
				f.Errorf("%s: NATS StatefulSet serviceName %q, want its headless Service %q", in.name, sn, headless.GetName())
			}
			if ip, _, _ := unstructured.NestedString(headless.Object, "spec", "clusterIP"); ip != "None" {
				f.Errorf("%s: %s clusterIP %q, want None", in.name, headless.GetName(), ip)
			}
			if r, _, _ := unstructured.NestedInt64(sts.Object, "spec", "replicas"); r != w.natsReplicas {
				f.Errorf("%s: NATS replicas %d, want %d", in.name, r, w.natsReplicas)
			}
			// The NATS pods read the public keys, never a seed.
			ctr := firstContainer(sts)
			env := envOf(f, "nats", ctr)
			for _, r := range roles {
				k := "NKEY_" + strings.ToUpper(strings.ReplaceAll(r, "-", "_"))
				if want := "secret:" + w.credSecret + "/" + r + ".pub"; env[k] != want {
					f.Errorf("%s: NATS env %s = %q, want %q", in.name, k, env[k], want)
				}
			}
			for k, v := range env {
				if strings.HasSuffix(v, ".nk") {
					f.Errorf("%s: NATS env %s holds a seed (%s)", in.name, k, v)
				}
			}
			if vols, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "volumes"); strings.Contains(yamlOf(vols), w.credSecret) {
				f.Errorf("%s: NATS pods mount the credentials Secret", in.name)
			}
			if pdb := get("PodDisruptionBudget", "", rel+"-nats"); pdb != nil {
				checkSelects(f, in.name, pdb, "spec", "selector", sts)
			}
		}
		checkNATSPolicy(f, in, get("NetworkPolicy", "", rel+"-nats"), sts, clients)
	}
}

// buildRules are the rules of the driver's Role in the build namespace
// for in: buildRoleFile's, its rule on secrets narrowed to the push Secret
// by name, or dropped when none is configured.
func buildRules(f failer, in install) []any {
	f.Helper()
	data, err := os.ReadFile(buildRoleFile)
	var role map[string]any
	if err == nil {
		err = sigsyaml.UnmarshalStrict(data, &role)
	}
	rules, _ := role["rules"].([]any)
	if err != nil || len(rules) == 0 {
		f.Errorf("%s: %v, %d rules", buildRoleFile, err, len(rules))
		return nil
	}
	var out []any
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		if !slices.Contains(rule["resources"].([]any), any("secrets")) {
			out = append(out, r)
			continue
		}
		if s := in.want.pushSecret; s != "" {
			named := maps.Clone(rule)
			named["resourceNames"] = []any{s}
			out = append(out, named)
		}
	}
	return out
}

// checkBuild asserts the build namespace (11.11, 11.16, 11.17): labelled
// Pod Security baseline when the chart creates it; the driver's Role there
// has exactly buildRules (so no secret but the push Secret, by name);
// the binding gives it to the driver's ServiceAccount; the build pods'
// policy selects every pod, admits no ingress, and blocks the configured
// CIDRs (the metadata IP by default) on egress.
func checkBuild(f failer, in install, ns, role, rb, np *unstructured.Unstructured) {
	f.Helper()
	w := in.want
	if ns != nil {
		if l := ns.GetLabels(); l["pod-security.kubernetes.io/enforce"] != "baseline" {
			f.Errorf("%s: build namespace labels %v, want Pod Security baseline enforced (11.17)", in.name, l)
		}
	}
	if role != nil {
		want := buildRules(f, in)
		if got := role.Object["rules"]; !reflect.DeepEqual(got, any(want)) {
			f.Errorf("%s: build Role rules differ from %s (+ the push Secret by name):\n got %s\nwant %s", in.name, buildRoleFile, yamlOf(got), yamlOf(want))
		}
	}
	if rb != nil {
		wantRef := map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": in.release + "-driver-build"}
		wantSubj := []any{map[string]any{"kind": "ServiceAccount", "name": in.release + "-pod-driver", "namespace": in.namespace}}
		if !reflect.DeepEqual(rb.Object["roleRef"], any(wantRef)) || !reflect.DeepEqual(rb.Object["subjects"], any(wantSubj)) {
			f.Errorf("%s: build RoleBinding roleRef %s subjects %s, want %s bound to %s", in.name, yamlOf(rb.Object["roleRef"]), yamlOf(rb.Object["subjects"]), yamlOf(wantRef), yamlOf(wantSubj))
		}
	}
	if np != nil {
		sel, _, _ := unstructured.NestedMap(np.Object, "spec", "podSelector")
		types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes")
		ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
		if len(sel) != 0 || !slices.Contains(types, "Ingress") || !slices.Contains(types, "Egress") || len(ingress) != 0 {
			f.Errorf("%s: build NetworkPolicy podSelector %v policyTypes %v ingress %v, want every pod, both types, no ingress", in.name, sel, types, ingress)
		}
		var blocked []any
		for _, p := range egressPeers(np) {
			if ip, ok := p["ipBlock"].(map[string]any); ok {
				blocked, _ = ip["except"].([]any)
			}
		}
		if !reflect.DeepEqual(blocked, w.buildBlocked) {
			f.Errorf("%s: build NetworkPolicy blocks %v, want %v", in.name, blocked, w.buildBlocked)
		}
	}
}

// checkSeed asserts the workload c holds exactly its own role's seed: one
// Secret volume with the single key <role>.nk of the credentials Secret,
// mounted read-only where RUNNER_NATS_NKEY_FILE points, and no seed or
// other role's key in its environment.
func checkSeed(f failer, in install, c string, pod, ctr map[string]any, env map[string]string) {
	f.Helper()
	role := busRole[c]
	if got, want := env["RUNNER_NATS_NKEY_FILE"], seedDir+role+".nk"; got != want {
		f.Errorf("%s: %s RUNNER_NATS_NKEY_FILE = %q, want %q", in.name, c, got, want)
	}
	for k, v := range env {
		if strings.HasPrefix(v, "secret:"+in.want.credSecret+"/") {
			f.Errorf("%s: %s env %s comes from the credentials Secret; seeds are files", in.name, c, k)
		}
	}
	vols, _, _ := unstructured.NestedSlice(pod, "volumes")
	var items []any
	n := 0
	for _, v := range vols {
		vm := v.(map[string]any)
		if s, ok := vm["secret"].(map[string]any); ok && s["secretName"] == in.want.credSecret {
			n++
			items, _ = s["items"].([]any)
			if vm["name"] != "nats-credentials" {
				f.Errorf("%s: %s mounts the credentials Secret as volume %v", in.name, c, vm["name"])
			}
		}
	}
	want := []any{map[string]any{"key": role + ".nk", "path": role + ".nk"}}
	if n != 1 || !reflect.DeepEqual(items, want) {
		f.Errorf("%s: %s mounts the credentials Secret %d times with items %s, want once with only %s.nk", in.name, c, n, yamlOf(items), role)
	}
	mounted := false
	mounts, _ := ctr["volumeMounts"].([]any)
	for _, m := range mounts {
		mm := m.(map[string]any)
		if mm["name"] == "nats-credentials" {
			mounted = mm["mountPath"] == strings.TrimSuffix(seedDir, "/") && mm["readOnly"] == true
		}
	}
	if !mounted {
		f.Errorf("%s: %s does not mount its seed read-only at %s", in.name, c, seedDir)
	}
}

// checkProbes asserts readiness on /readyz and liveness on /healthz of
// the container's port named portName, which listens on want.
func checkProbes(f failer, what string, ctr map[string]any, portName string, want int64) {
	f.Helper()
	for probe, p := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		path, _, _ := unstructured.NestedString(ctr, probe, "httpGet", "path")
		port, _, _ := unstructured.NestedFieldNoCopy(ctr, probe, "httpGet", "port")
		if path != p || port != portName {
			f.Errorf("%s: %s GET %v on %v, want %s on %s", what, probe, path, port, p, portName)
		}
	}
	ports, _ := ctr["ports"].([]any)
	found := false
	for _, p := range ports {
		pm := p.(map[string]any)
		if pm["name"] == portName && pm["containerPort"] == want {
			found = true
		}
	}
	if !found {
		f.Errorf("%s: no container port %s = %d %s", what, portName, want, yamlOf(ports))
	}
}

func firstContainer(o *unstructured.Unstructured) map[string]any {
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		return map[string]any{}
	}
	return cs[0].(map[string]any)
}

func mountDirs(ctr map[string]any) []string {
	var out []string
	mounts, _ := ctr["volumeMounts"].([]any)
	for _, m := range mounts {
		if p, ok := m.(map[string]any)["mountPath"].(string); ok {
			out = append(out, p)
		}
	}
	return out
}

// selector reads a LabelSelector at path of o.
func selector(f failer, what string, m map[string]any) labels.Selector {
	f.Helper()
	var ls metav1.LabelSelector
	js, err := sigsyaml.Marshal(m)
	if err == nil {
		err = sigsyaml.Unmarshal(js, &ls)
	}
	if err != nil {
		f.Errorf("%s: selector %v: %v", what, m, err)
		return labels.Nothing()
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		f.Errorf("%s: selector %v: %v", what, m, err)
		return labels.Nothing()
	}
	return sel
}

// checkSelects asserts the selector at path of o selects workload's pods.
func checkSelects(f failer, name string, o *unstructured.Unstructured, path1, path2 string, workload *unstructured.Unstructured) {
	f.Helper()
	m, _, _ := unstructured.NestedMap(o.Object, path1, path2)
	podLabels, _, _ := unstructured.NestedStringMap(workload.Object, "spec", "template", "metadata", "labels")
	if !selector(f, name, m).Matches(labels.Set(podLabels)) || len(m) == 0 {
		f.Errorf("%s: %s %s selector %v does not select %s's pods %v", name, o.GetKind(), o.GetName(), m, workload.GetName(), podLabels)
	}
}

// checkNATSPolicy asserts the release namespace's NATS policy: it selects
// the NATS pods, isolates their ingress, admits the client port only from
// pods of this namespace that are the runner's bus clients (plus the
// configured extra peers), and the route port only from NATS pods.
func checkNATSPolicy(f failer, in install, np, sts *unstructured.Unstructured, clients map[string]*unstructured.Unstructured) {
	f.Helper()
	if np == nil || sts == nil {
		return
	}
	checkSelects(f, in.name, np, "spec", "podSelector", sts)
	if types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes"); !slices.Contains(types, "Ingress") {
		f.Errorf("%s: NATS NetworkPolicy policyTypes %v, want Ingress", in.name, types)
	}
	natsLabels, _, _ := unstructured.NestedStringMap(sts.Object, "spec", "template", "metadata", "labels")
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	var clientPeers, routePeers []any
	for _, r := range rules {
		rm := r.(map[string]any)
		ports, _ := rm["ports"].([]any)
		from, _ := rm["from"].([]any)
		if len(ports) == 0 || len(from) == 0 {
			f.Errorf("%s: NATS NetworkPolicy rule %s admits every port or every peer", in.name, yamlOf(rm))
			continue
		}
		for _, p := range ports {
			switch fmt.Sprint(p.(map[string]any)["port"]) {
			case "4222":
				clientPeers = append(clientPeers, from...)
			case "6222":
				routePeers = append(routePeers, from...)
			default:
				f.Errorf("%s: NATS NetworkPolicy opens port %v", in.name, p)
			}
		}
	}
	// Runner peers: a pod selector alone (this namespace only).
	var extra []any
	var runnerSel []labels.Selector
	for _, p := range clientPeers {
		pm := p.(map[string]any)
		if _, ns := pm["namespaceSelector"]; ns || pm["ipBlock"] != nil {
			extra = append(extra, p)
			continue
		}
		ps, _ := pm["podSelector"].(map[string]any)
		if len(ps) == 0 {
			f.Errorf("%s: NATS client peer %s selects every pod of the namespace", in.name, yamlOf(pm))
			continue
		}
		runnerSel = append(runnerSel, selector(f, in.name, ps))
	}
	if !reflect.DeepEqual(extra, in.want.extraNATSClients) && (len(extra) > 0 || len(in.want.extraNATSClients) > 0) {
		f.Errorf("%s: NATS client peers from other namespaces %s, want %s", in.name, yamlOf(extra), yamlOf(in.want.extraNATSClients))
	}
	matches := func(sels []labels.Selector, l map[string]string) bool {
		return slices.ContainsFunc(sels, func(s labels.Selector) bool { return s.Matches(labels.Set(l)) })
	}
	for c, d := range clients {
		l, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		if !matches(runnerSel, l) {
			f.Errorf("%s: NATS NetworkPolicy does not admit %s's pods %v", in.name, c, l)
		}
	}
	// Not admitted: another release's services, a session pod, anything else.
	for _, l := range []map[string]string{
		{"app.kubernetes.io/component": "api-edge", "app.kubernetes.io/instance": in.release + "-other"},
		{"app.kubernetes.io/managed-by": in.want.managedBy},
		{"app.kubernetes.io/component": "debug", "app.kubernetes.io/instance": in.release},
		{},
	} {
		if matches(runnerSel, l) {
			f.Errorf("%s: NATS NetworkPolicy admits pods labelled %v", in.name, l)
		}
	}
	var routeSel []labels.Selector
	for _, p := range routePeers {
		pm := p.(map[string]any)
		ps, _ := pm["podSelector"].(map[string]any)
		if _, ns := pm["namespaceSelector"]; ns || len(ps) == 0 {
			f.Errorf("%s: NATS route peer %s is not the NATS pods", in.name, yamlOf(pm))
			continue
		}
		routeSel = append(routeSel, selector(f, in.name, ps))
	}
	if !matches(routeSel, natsLabels) {
		f.Errorf("%s: NATS route port does not admit the NATS pods %v", in.name, natsLabels)
	}
	for c, d := range clients {
		l, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		if matches(routeSel, l) {
			f.Errorf("%s: NATS route port admits %s's pods", in.name, c)
		}
	}
}

// checkSessionGuards asserts the session NetworkPolicy and ResourceQuota
// of 11.17: the policy selects pods by the configured managed-by value
// (19 item 26), admits ingress only from the release namespace (and the
// ingress controller's), and lets egress reach DNS and anything outside
// the blocked CIDRs — never the release namespace (issue 11; the API
// server test also evaluates the rules against the namespace's labels
// and the Services' addresses).
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
			map[string]any{"to": []any{nsSel(w.dnsNS)}, "ports": []any{
				map[string]any{"protocol": "UDP", "port": int64(53)}, map[string]any{"protocol": "TCP", "port": int64(53)}}},
			map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "0.0.0.0/0", "except": w.blockedCIDRs}}}},
		}
		if !reflect.DeepEqual(spec["egress"], any(wantEgress)) {
			f.Errorf("%s: NetworkPolicy egress = %s, want %s", in.name, yamlOf(spec["egress"]), yamlOf(wantEgress))
		}
		for _, p := range egressPeers(np) {
			if sel, ok := p["namespaceSelector"].(map[string]any); ok {
				if selector(f, in.name, sel).Matches(labels.Set{"kubernetes.io/metadata.name": in.namespace}) {
					f.Errorf("%s: session NetworkPolicy egress peer %s reaches the release namespace %s", in.name, yamlOf(p), in.namespace)
				}
			}
		}
	}
	if quota != nil {
		var q map[string]any
		if in.values == "" || strings.Contains(in.values, "sessionQuota: {enabled: false}") {
			q = map[string]any{"pods": "32", "limits.cpu": "4", "limits.memory": "8Gi", "requests.cpu": "2", "requests.memory": "4Gi"}
		} else {
			q = map[string]any{"pods": "64", "limits.cpu": "8", "limits.memory": "16Gi", "requests.cpu": "4", "requests.memory": "8Gi"}
		}
		if got := nested(f, quota, "spec")["hard"]; !reflect.DeepEqual(got, any(q)) {
			f.Errorf("%s: ResourceQuota hard = %s, want %s", in.name, yamlOf(got), yamlOf(q))
		}
	}
}

// egressPeers are the "to" peers of every egress rule of np.
func egressPeers(np *unstructured.Unstructured) []map[string]any {
	var out []map[string]any
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "egress")
	for _, r := range rules {
		to, _ := r.(map[string]any)["to"].([]any)
		if len(to) == 0 {
			// A rule without peers reaches everything.
			out = append(out, map[string]any{"namespaceSelector": map[string]any{}})
		}
		for _, p := range to {
			out = append(out, p.(map[string]any))
		}
	}
	return out
}

// checkService asserts svc selects workload's pods and targets a port the
// workload's container names portName.
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

// envOf is a container's env: literal values, and "secret:<name>/<key>"
// for a value from a Secret; a name given twice is an error.
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
		if ref, ok, _ := unstructured.NestedStringMap(m, "valueFrom", "secretKeyRef"); ok {
			v = "secret:" + ref["name"] + "/" + ref["key"]
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
	if name == "RUNNER_WATCH_SESSIONS" {
		return false // a boolean
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
		{"build rule dropped", "files/build-role.yaml", func(s string) string {
			return strings.Replace(s, `verbs: ["get", "create", "update", "delete"]`, `verbs: ["get", "create", "update"]`, 1)
		}, "build Role rules differ", 0},
		{"every secret readable in the build namespace", "templates/buildrole.yaml", func(s string) string {
			return strings.Replace(s, `"resourceNames" (list $push) `, "", 1)
		}, "build Role rules differ", 1},
		{"secrets rule kept without a push secret", "templates/buildrole.yaml", func(s string) string {
			return strings.Replace(s, "{{- if $push -}}", "{{- if true -}}", 1)
		}, "build Role rules differ", 0},
		{"build binding to the wrong namespace", "templates/buildrole.yaml", func(s string) string {
			return strings.Replace(s, "namespace: {{ .Release.Namespace }}", "namespace: {{ $b.namespace }}", 1)
		}, "build RoleBinding", 0},
		{"build namespace restricted", "templates/buildrole.yaml", func(s string) string {
			return strings.Replace(s, "enforce: baseline", "enforce: privileged", 1)
		}, "Pod Security baseline", 0},
		{"build egress to the metadata IP", "templates/buildrole.yaml", func(s string) string {
			return strings.Replace(s, "except: {{- toYaml . | nindent 14 }}", "", 1)
		}, "build NetworkPolicy blocks", 0},
		{"driver without the build namespace", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "- {name: RUNNER_BUILD_NAMESPACE, value: {{ .build.namespace | quote }}}", "", 1)
		}, "pod-driver env RUNNER_BUILD_NAMESPACE", 0},
		{"edge without the menu switch", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "- {name: RUNNER_BASE_IMAGE_CATALOG_ENABLED, value: {{ .enabled | toString | quote }}}", "", 1)
		}, "api-edge env RUNNER_BASE_IMAGE_CATALOG_ENABLED", 1},
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
		{"session egress to the release namespace", "templates/sessionnetwork.yaml", func(s string) string {
			return strings.Replace(s, "  egress:\n", "  egress:\n    - to:\n        - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: {{ .Release.Namespace | quote }}}}\n", 1)
		}, "reaches the release namespace", 0},
		{"service holds every seed", "templates/_helpers.tpl", func(s string) string {
			return strings.Replace(s, "    items: [{key: {{ .role }}.nk, path: {{ .role }}.nk}]\n", "", 1)
		}, "want once with only", 0},
		{"seed in the environment", "templates/_helpers.tpl", func(s string) string {
			return strings.Replace(s, "- {name: LOG_LEVEL,", "- name: SEED\n  valueFrom: {secretKeyRef: {name: {{ include \"telorunner.credentialsSecret\" .root }}, key: {{ .role }}.nk}}\n- {name: LOG_LEVEL,", 1)
		}, "comes from the credentials Secret", 0},
		{"NATS open to any pod of the release", "templates/natsnetwork.yaml", func(s string) string {
			return strings.Replace(s, "operator: In, values: [api-edge, pod-driver, supervisor, workspace-proxy, provision]", "operator: Exists", 1)
		}, "NATS NetworkPolicy admits pods", 0},
		{"edge without the kernel image", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "- {name: RUNNER_IMAGE, value: {{ $v.session.kernelImage | quote }}}", "", 1)
		}, "api-edge env RUNNER_IMAGE", 0},
		{"probe on the wrong path", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "path: /readyz, port: ops", "path: /metrics, port: ops", 1)
		}, "readinessProbe GET /metrics", 0},
		{"integer printed as float", "templates/services.yaml", func(s string) string {
			return strings.Replace(s, "watch.maxTTLSeconds | int64 | quote", "watch.maxTTLSeconds | quote", 1)
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
