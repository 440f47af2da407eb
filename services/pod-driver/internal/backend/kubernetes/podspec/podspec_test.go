package podspec

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

func testParams() Params {
	return Params{
		Namespace: "telo-sessions", ManagedBy: "telo-k8s-runner",
		KernelImage: "telorun/node:test", WorkspaceImage: "telorunner/workspace:test",
		RunLimits:       Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits:       Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
		WatchTTLSeconds: 21600,
		BaseDomain:      "sessions.example.com",
	}
}

func TestParseAndClamp(t *testing.T) {
	cpu := []struct {
		in   string
		want int64
	}{{"500m", 500}, {"1", 1000}, {"0.5", 500}, {"2", 2000}}
	for _, c := range cpu {
		if got, err := ParseCPU(c.in); err != nil || got != c.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	mem := []struct {
		in   string
		want int64
	}{{"100Mi", 100 << 20}, {"1Gi", 1 << 30}, {"1K", 1000}, {"1k", 1000}, {"2M", 2e6}, {"5", 5}}
	for _, c := range mem {
		if got, err := ParseBytes(c.in); err != nil || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	clamps := []struct{ req, ceil, want string }{
		{"", "50m", "50m"}, {"25m", "50m", "25m"}, {"1", "50m", "50m"}, {"bogus", "50m", "50m"}, {"0.01", "50m", "0.01"},
	}
	for _, c := range clamps {
		if got := Clamp(c.req, c.ceil, ParseCPU); got != c.want {
			t.Errorf("Clamp(%q, %q) = %q, want %q", c.req, c.ceil, got, c.want)
		}
	}
	if got := Clamp("200Mi", "100Mi", ParseBytes); got != "100Mi" {
		t.Errorf("Clamp(200Mi, 100Mi) = %q, want 100Mi", got)
	}
	for _, c := range []struct{ req, ceil, want int64 }{{0, 3600, 3600}, {60, 3600, 60}, {7200, 3600, 3600}} {
		if got := ClampTTL(c.req, c.ceil); got != c.want {
			t.Errorf("ClampTTL(%d, %d) = %d, want %d", c.req, c.ceil, got, c.want)
		}
	}
}

// A run pod honours the request's pullPolicy (11.6's mapping) and, without
// inspect, still puts its flag before the path.
func TestRunPodPullPolicyAndArgv(t *testing.T) {
	for pol, want := range map[string]corev1.PullPolicy{"always": corev1.PullAlways, "never": corev1.PullNever, "missing": corev1.PullIfNotPresent} {
		spec := backend.Spec{
			SessionID: "abcdefghijkl", Mode: contract.ModeRun,
			Config: contract.SessionConfig{Image: "telorun/node:latest-slim", PullPolicy: pol},
			Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: "kind: x"}}},
			Apps:   []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOTTY}},
		}
		pod, _, err := Run(testParams(), spec)
		if err != nil {
			t.Fatalf("Run() error = %v", err)
		}
		c := pod.Spec.Containers[0]
		if c.ImagePullPolicy != want {
			t.Errorf("pullPolicy %s: ImagePullPolicy = %v, want %v", pol, c.ImagePullPolicy, want)
		}
		if argv := []string{"telo", "run", "--no-cache-write", "/app/telo.yaml"}; !slices.Equal(c.Command, argv) {
			t.Errorf("Command = %v, want %v", c.Command, argv)
		}
	}
}

func TestRunPod(t *testing.T) {
	p := testParams()
	spec := backend.Spec{
		SessionID: "abcdefghijkl", Mode: contract.ModeRun, Inspect: true,
		Env: map[string]string{"A": "1", "HOME": "/evil"},
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "telo.yaml", Contents: "kind: x"}, {RelativePath: "./lib/a.bin", Contents: "AAE=", Encoding: "base64"},
		}},
		Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{{Port: 8080, Protocol: "tcp"}}}},
	}
	pod, cm, err := Run(p, spec)
	if err != nil {
		t.Fatalf("Run() error = %v", err)
	}
	if pod.Name != "telo-run-abcdefghijkl" || pod.Labels[LabelSession] != spec.SessionID || pod.Labels[LabelManagedBy] != p.ManagedBy {
		t.Errorf("pod meta = %v %v", pod.Name, pod.Labels)
	}
	c := pod.Spec.Containers[0]
	// Flags before the path (A42).
	want := []string{"telo", "run", "--no-cache-write", "--inspect", "0.0.0.0:9230", "--no-open", "/app/telo.yaml"}
	if !slices.Equal(c.Command, want) {
		t.Errorf("Command = %v, want %v", c.Command, want)
	}
	// No TELO_CACHE_DIR on the read-only root (no baked cache), the
	// session's one dropped too.
	if got := envMap(c.Env); got["HOME"] != "/home/telo" || got["A"] != "1" || got["FORCE_COLOR"] != "1" || got["TELO_CACHE_DIR"] != "" {
		t.Errorf("env = %v", got)
	}
	if !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("session container root is writable, want read-only (HARDENED)")
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("ImagePullPolicy = %v, want IfNotPresent for pullPolicy missing", c.ImagePullPolicy)
	}
	if !c.TTY || !c.Stdin || c.StdinOnce {
		t.Errorf("tty/stdin = %v/%v/%v, want true/true/false", c.TTY, c.Stdin, c.StdinOnce)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || *pod.Spec.ActiveDeadlineSeconds != 3600 || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("pod spec policy = %v %v %v", pod.Spec.RestartPolicy, *pod.Spec.ActiveDeadlineSeconds, *pod.Spec.AutomountServiceAccountToken)
	}
	if string(cm.BinaryData["f1"]) != "\x00\x01" || cm.Name != "telo-bundle-abcdefghijkl" {
		t.Errorf("configmap = %v %q", cm.Name, cm.BinaryData)
	}
	vol := pod.Spec.Volumes[0].ConfigMap
	if vol == nil || vol.Name != cm.Name || vol.Items[1].Path != "lib/a.bin" {
		t.Errorf("app volume = %+v", pod.Spec.Volumes[0])
	}
	if c.Ports[0].Name != "tcp-8080" {
		t.Errorf("port name = %q, want tcp-8080", c.Ports[0].Name)
	}

	big := spec
	big.Bundle.Files = []contract.BundleFile{{RelativePath: "telo.yaml", Contents: strings.Repeat("x", MaxBundleBytes)}}
	if _, _, err := Run(p, big); err == nil {
		t.Errorf("Run(oversized bundle) error = nil, want one")
	}
}

func TestAppPodIsNonRoot(t *testing.T) {
	pod, err := App(testParams(), backend.Spec{SessionID: "abcdefghijkl", Mode: contract.ModeRun, SelfContained: true,
		Config: contract.SessionConfig{Image: "op/app:1", PullPolicy: "always"}, Env: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatalf("App() error = %v", err)
	}
	c := pod.Spec.Containers[0]
	if !*pod.Spec.SecurityContext.RunAsNonRoot || c.Command != nil || c.ImagePullPolicy != corev1.PullAlways || envMap(c.Env)["K"] != "v" {
		t.Errorf("app pod = %+v", pod.Spec)
	}
}

func TestWatchPodShape(t *testing.T) {
	spec := backend.Spec{SessionID: "abcdefghijkl", Mode: contract.ModeWatch,
		Env: map[string]string{"S": "1", "TELO_CACHE_DIR": "/x"},
		Apps: []backend.App{
			{Name: "web", Entry: "web/telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{{Port: 8080, Protocol: "tcp"}, {Port: 8080, Protocol: "udp"}}},
			{Name: "worker", Entry: "worker/telo.yaml", IO: contract.IOStreams},
		},
		Agent: &backend.Agent{Name: "claude", Image: "op/agent", Env: map[string]string{"API_KEY": "k"}, Port: 7000},
	}
	pod, err := Watch(testParams(), spec, "telo-watch-abcdefghijkl-x1")
	if err != nil {
		t.Fatalf("Watch() error = %v", err)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyAlways || pod.Labels[LabelMode] != "watch" {
		t.Errorf("restart/mode = %v %v", pod.Spec.RestartPolicy, pod.Labels)
	}
	names := []string{}
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
	}
	if want := []string{"workspace", "app-web", "app-worker", "agent"}; !slices.Equal(names, want) {
		t.Fatalf("containers = %v, want %v", names, want)
	}
	if got := envMap(pod.Spec.Containers[0].Env); len(got) != 2 || got["PORT"] != "8099" || got["WORKSPACE_DIR"] != "/workspace" {
		t.Errorf("workspace env = %v, want exactly PORT and WORKSPACE_DIR", got)
	}
	web := pod.Spec.Containers[1]
	if want := []string{"sh", "-c", `while [ ! -f "$TELO_ENTRY" ]; do sleep 0.2; done; exec telo run --watch --inspect "$TELO_INSPECT_ADDR" --no-open "$TELO_ENTRY"`}; !slices.Equal(web.Command, want) {
		t.Errorf("app command = %v, want %v", web.Command, want)
	}
	env := envMap(web.Env)
	if env["TELO_ENTRY"] != "/workspace/web/telo.yaml" || env["TELO_INSPECT_ADDR"] != "0.0.0.0:9230" || env["CLICOLOR_FORCE"] != "1" || env["S"] != "1" || env["TELO_CACHE_DIR"] != "" {
		t.Errorf("web env = %v", env)
	}
	if e := envMap(pod.Spec.Containers[2].Env); e["TELO_INSPECT_ADDR"] != "0.0.0.0:9231" || e["CLICOLOR_FORCE"] != "" {
		t.Errorf("worker env = %v", e)
	}
	if e := envMap(pod.Spec.Containers[3].Env); e["API_KEY"] != "k" || e["S"] != "" || e["WORKSPACE_DIR"] != "/workspace" {
		t.Errorf("agent env = %v", e)
	}
	if got := []string{web.Ports[0].Name, web.Ports[1].Name}; !slices.Equal(got, []string{"tcp-8080", "udp-8080"}) {
		t.Errorf("port names = %v", got)
	}

	for _, bad := range []backend.Spec{
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "workspace", Entry: "a"}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "a", Entry: "a"}, {Name: "a", Entry: "b"}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "a", Entry: "a", Ports: []contract.PortMapping{{Port: 8099, Protocol: "tcp"}}}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "a", Entry: "a", Ports: []contract.PortMapping{{Port: 9230, Protocol: "tcp"}}}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "a", Entry: "a", Ports: []contract.PortMapping{{Port: 1, Protocol: "tcp"}}}, {Name: "b", Entry: "b", Ports: []contract.PortMapping{{Port: 1, Protocol: "tcp"}}}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: "a", Entry: "../x"}}},
		{SessionID: "abcdefghijkl", Apps: []backend.App{{Name: strings.Repeat("a", 64), Entry: "x"}}},
	} {
		if _, err := Watch(testParams(), bad, "telo-watch-abcdefghijkl-1"); err == nil {
			t.Errorf("Watch(%+v) error = nil, want one", bad.Apps)
		}
	}
}

func TestRouting(t *testing.T) {
	p := testParams()
	owner := &corev1.Pod{}
	owner.Name, owner.UID = "telo-watch-abcdefghijkl-1", "uid-1"
	ports := []contract.PortMapping{{Port: 8080, Protocol: "tcp"}, {Port: 8080, Protocol: "udp"}, {Port: 9000, Protocol: "tcp"}, {Port: 8080, Protocol: "tcp"}}
	svc := Service(p, "abcdefghijkl", owner, ports)
	var names []string
	for _, sp := range svc.Spec.Ports {
		names = append(names, sp.Name)
	}
	if want := []string{"tcp-8080", "udp-8080", "tcp-9000"}; !slices.Equal(names, want) {
		t.Errorf("service ports = %v, want %v", names, want)
	}
	if ref := svc.OwnerReferences[0]; ref.UID != "uid-1" || !*ref.Controller || ref.Kind != "Pod" {
		t.Errorf("owner = %+v", ref)
	}
	ing := Ingress(p, "abcdefghijkl", owner, ports)
	var hosts []string
	for _, r := range ing.Spec.Rules {
		hosts = append(hosts, r.Host)
	}
	if want := []string{"8080-abcdefghijkl.sessions.example.com", "9000-abcdefghijkl.sessions.example.com"}; !slices.Equal(hosts, want) {
		t.Errorf("ingress hosts = %v, want %v", hosts, want)
	}
	if Ingress(p, "abcdefghijkl", owner, ports[1:2]) != nil {
		t.Errorf("Ingress(udp only) != nil")
	}
	eps := Endpoints(p, "abcdefghijkl", ports[:2])
	if eps[0].URL != "https://8080-abcdefghijkl.sessions.example.com" || eps[1].Host != "" {
		t.Errorf("endpoints = %+v", eps)
	}
}

func TestWatchPodNamesAreFresh(t *testing.T) {
	n := Namer{Now: func() time.Time { return time.UnixMilli(1_700_000_000_000) }}
	seen := map[string]bool{}
	for range 1000 {
		name := n.WatchPodName("abcdefghijkl")
		if seen[name] || !ValidDNSLabel(name) {
			t.Fatalf("WatchPodName() = %q (seen %v), want fresh valid names", name, seen[name])
		}
		seen[name] = true
	}
}

// TestPodProperties checks the invariants over generated watch and run
// specs: the credential boundary, hardening, ceilings, names, port names.
func TestPodProperties(t *testing.T) {
	p := testParams()
	r := rand.New(rand.NewPCG(1, 2))
	n := Namer{}
	ceil := p.AppLimits
	for i := range 600 {
		spec := genSpec(r)
		pod, err := Watch(p, spec, n.WatchPodName(spec.SessionID))
		if err != nil {
			continue // a generated port clash; refusals are tested above
		}
		checkPod(t, i, pod, spec, ceil)
		spec.Agent = nil
		spec.Apps = spec.Apps[:1]
		spec.Mode = contract.ModeRun
		run, _, err := Run(p, spec)
		if err != nil {
			t.Fatalf("case %d: Run() error = %v", i, err)
		}
		checkPod(t, i, run, spec, p.RunLimits)
	}
}

func checkPod(t *testing.T, i int, pod *corev1.Pod, spec backend.Spec, ceil Limits) {
	t.Helper()
	if !ValidDNSLabel(pod.Name) {
		t.Errorf("case %d: pod name %q is not a DNS label", i, pod.Name)
	}
	if ps := pod.Spec.SecurityContext; ps == nil || !*ps.RunAsNonRoot || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("case %d: pod security context = %+v", i, ps)
	}
	portNames := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		if !ValidDNSLabel(c.Name) {
			t.Errorf("case %d: container name %q invalid", i, c.Name)
		}
		env := envMap(c.Env)
		isApp := c.Name == ContainerSession || strings.HasPrefix(c.Name, AppContainerPfx)
		for k := range spec.Env {
			if _, ok := env[k]; ok && !isApp {
				t.Errorf("case %d: session env %s reaches %s", i, k, c.Name)
			}
		}
		if isApp && env["HOME"] != "/home/telo" {
			t.Errorf("case %d: %s HOME = %q, the session env must not override it", i, c.Name, env["HOME"])
		}
		if spec.Agent != nil {
			for k := range spec.Agent.Env {
				if _, ok := env[k]; ok && c.Name != ContainerAgent {
					t.Errorf("case %d: operator env %s reaches %s", i, k, c.Name)
				}
			}
		}
		sc := c.SecurityContext
		if sc == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("case %d: %s security context = %+v", i, c.Name, sc)
		}
		if c.Name != ContainerAgent && (sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || !*sc.RunAsNonRoot) {
			t.Errorf("case %d: %s is not HARDENED: %+v", i, c.Name, sc)
		}
		lim := c.Resources.Limits
		if lim.Cpu().Cmp(resource.MustParse(ceil.CPU)) > 0 || lim.Memory().Cmp(resource.MustParse(ceil.Memory)) > 0 ||
			lim.StorageEphemeral().Cmp(resource.MustParse(ceil.EphemeralStorage)) > 0 {
			t.Errorf("case %d: %s limits %v over the ceiling", i, c.Name, lim)
		}
		if !c.Resources.Requests.Cpu().Equal(*lim.Cpu()) || !c.Resources.Requests.Memory().Equal(*lim.Memory()) {
			t.Errorf("case %d: %s requests != limits", i, c.Name)
		}
		for _, cp := range c.Ports {
			want := fmt.Sprintf("%s-%d", strings.ToLower(string(cp.Protocol)), cp.ContainerPort)
			if cp.Name != want || portNames[cp.Name] {
				t.Errorf("case %d: port name %q (want %q, unique)", i, cp.Name, want)
			}
			portNames[cp.Name] = true
		}
	}
}

func genSpec(r *rand.Rand) backend.Spec {
	spec := backend.Spec{SessionID: contract.NewSessionID(), Mode: contract.ModeWatch, Env: map[string]string{}}
	for range r.IntN(5) {
		spec.Env[fmt.Sprintf("SESSION_%d", r.IntN(100))] = fmt.Sprintf("s-%d", r.IntN(1000))
	}
	if r.IntN(4) == 0 {
		spec.Env["HOME"] = "/evil"
	}
	nApps := 1 + r.IntN(4)
	for a := range nApps {
		app := backend.App{Name: fmt.Sprintf("app%d-%s", a, strings.Repeat("x", r.IntN(40))), Entry: fmt.Sprintf("a%d/telo.yaml", a), IO: []string{contract.IOTTY, contract.IOStreams}[r.IntN(2)]}
		for range r.IntN(3) {
			app.Ports = append(app.Ports, contract.PortMapping{Port: 1000 + a*100 + r.IntN(50), Protocol: []string{"tcp", "udp"}[r.IntN(2)]})
		}
		spec.Apps = append(spec.Apps, app)
	}
	spec.Bundle = contract.Bundle{EntryRelativePath: "a0/telo.yaml", Files: []contract.BundleFile{{RelativePath: "a0/telo.yaml", Contents: "x"}}}
	if r.IntN(2) == 0 {
		spec.Agent = &backend.Agent{Name: "agent", Image: "op/agent", Port: 7000, Env: map[string]string{}}
		for range 1 + r.IntN(3) {
			spec.Agent.Env[fmt.Sprintf("OP_%d", r.IntN(100))] = fmt.Sprintf("op-%d", r.IntN(1000))
		}
	}
	return spec
}

func envMap(env []corev1.EnvVar) map[string]string {
	m := map[string]string{}
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

// App names of 60–63 characters are valid (3.9: a DNS label of 1–63) and
// their pod is too: every container name is a DNS label of at most 63
// characters, distinct per app (the API server refuses app-<63 chars>).
func TestWatchPodLongAppNames(t *testing.T) {
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	names := []string{long(59, "a"), long(60, "a"), long(63, "a"), long(62, "a") + "b", long(49, "c") + "-" + long(13, "d")}
	var apps []backend.App
	for _, n := range names {
		apps = append(apps, backend.App{Name: n, Entry: "telo.yaml", IO: contract.IOTTY})
	}
	spec := backend.Spec{SessionID: "abcdefghijkl", Mode: contract.ModeWatch, Apps: apps,
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml"}}
	pod, err := Watch(testParams(), spec, "telo-watch-abcdefghijkl-x")
	if err != nil {
		t.Fatalf("Watch() error = %v", err)
	}
	seen := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		if !ValidDNSLabel(c.Name) || seen[c.Name] {
			t.Errorf("container name %q (%d chars) is not a distinct DNS label", c.Name, len(c.Name))
		}
		seen[c.Name] = true
	}
	if got := AppContainerName(long(59, "a")); got != "app-"+long(59, "a") {
		t.Errorf("AppContainerName(59 chars) = %q, want app-<name> unchanged", got)
	}
	if _, err := Watch(testParams(), backend.Spec{SessionID: "abcdefghijkl", Mode: contract.ModeWatch,
		Apps: []backend.App{{Name: long(64, "a"), Entry: "telo.yaml"}}}, "x"); err == nil {
		t.Error("Watch() with a 64-character app name = nil error, want one")
	}
}
