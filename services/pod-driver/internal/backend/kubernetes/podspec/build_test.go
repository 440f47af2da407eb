package podspec

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

func testBuildParams(builder string) BuildParams {
	return BuildParams{
		Namespace: "telo-builds", ManagedBy: "telo-k8s-runner", Builder: builder,
		BuilderImage: "ghcr.io/telorunner/telo-layer:test", InitImage: "busybox:stable",
		TimeoutSeconds: 600, PushSecret: "push", Limits: testParams().AppLimits,
	}
}

func testBuildSpec() BuildSpec {
	return BuildSpec{
		Tag: "0123456789abcdef0123456789abcdef", Ref: "reg.example/telo/apps:0123456789abcdef0123456789abcdef",
		BaseImage: "telorun/node:1.4.0", Entry: "./telo.yaml", TeloRegistryURL: "https://registry.telo.run",
		Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: "kind: Telo.Application\n"}, {RelativePath: "lib/x.yaml", Contents: "a: 1\n"}},
	}
}

func mountMap(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, v := range c.VolumeMounts {
		ro := ""
		if v.ReadOnly {
			ro = ":ro"
		}
		m[v.MountPath] = v.Name + ro
	}
	return m
}

// The common Job shape of contract 11.11 step 5 (both builders).
func checkJob(t *testing.T, builder string) (*corev1.PodSpec, *corev1.ConfigMap) {
	t.Helper()
	p, b := testBuildParams(builder), testBuildSpec()
	job, cm, err := BuildJob(p, b)
	if err != nil {
		t.Fatal(err)
	}
	if job.Name != "telo-build-"+b.Tag || job.Namespace != "telo-builds" || cm.Name != job.Name || cm.Namespace != job.Namespace {
		t.Fatalf("names %s/%s, %s/%s", job.Namespace, job.Name, cm.Namespace, cm.Name)
	}
	want := map[string]string{LabelManagedBy: "telo-k8s-runner", LabelBuild: "true"}
	if !reflect.DeepEqual(job.Labels, want) || !reflect.DeepEqual(job.Spec.Template.Labels, want) || !reflect.DeepEqual(cm.Labels, want) {
		t.Errorf("labels %v / %v / %v", job.Labels, job.Spec.Template.Labels, cm.Labels)
	}
	if *job.Spec.BackoffLimit != 0 || *job.Spec.ActiveDeadlineSeconds != 600 || *job.Spec.TTLSecondsAfterFinished != 300 {
		t.Errorf("job limits %d %d %d", *job.Spec.BackoffLimit, *job.Spec.ActiveDeadlineSeconds, *job.Spec.TTLSecondsAfterFinished)
	}
	s := &job.Spec.Template.Spec
	if s.RestartPolicy != corev1.RestartPolicyNever || *s.AutomountServiceAccountToken {
		t.Errorf("restart %s, token %v", s.RestartPolicy, *s.AutomountServiceAccountToken)
	}
	return s, cm
}

func TestBuildJobLayer(t *testing.T) {
	s, cm := checkJob(t, BuilderLayer)
	if len(cm.BinaryData) != 2 {
		t.Errorf("context configmap has %d files, want the bundle's 2", len(cm.BinaryData))
	}
	if s.SecurityContext == nil || !*s.SecurityContext.RunAsNonRoot || *s.SecurityContext.RunAsUser != RunUser {
		t.Errorf("pod security %+v", s.SecurityContext)
	}
	if len(s.InitContainers) != 1 || len(s.Containers) != 1 {
		t.Fatalf("%d init containers, %d containers", len(s.InitContainers), len(s.Containers))
	}
	in, push := s.InitContainers[0], s.Containers[0]
	if in.Image != "telorun/node:1.4.0" || !slices.Equal(in.Command, []string{"telo", "install", "/app/telo.yaml"}) {
		t.Errorf("install %s %v", in.Image, in.Command)
	}
	env := map[string]string{}
	for _, e := range in.Env {
		env[e.Name] = e.Value
	}
	if env["TELO_CACHE_DIR"] != "/telo-cache" || env["TELO_REGISTRY_URL"] != "https://registry.telo.run" {
		t.Errorf("install env %v", env)
	}
	if m := mountMap(in); m["/app"] != "bundle:ro" || m["/telo-cache"] != "telo-cache" || m["/docker"] != "" {
		t.Errorf("install mounts %v (the push secret must not reach it)", m)
	}
	wantCmd := []string{"telo-layer", "--base", "telorun/node:1.4.0", "--dest", testBuildSpec().Ref, "--app", "/app", "--cache", "/telo-cache"}
	if push.Image != "ghcr.io/telorunner/telo-layer:test" || !slices.Equal(push.Command, wantCmd) {
		t.Errorf("push %s %v", push.Image, push.Command)
	}
	if m := mountMap(push); m["/app"] != "bundle:ro" || m["/telo-cache"] != "telo-cache:ro" || m["/docker"] != "push-secret:ro" {
		t.Errorf("push mounts %v", m)
	}
	if len(push.Env) != 1 || push.Env[0] != (corev1.EnvVar{Name: "DOCKER_CONFIG", Value: "/docker"}) {
		t.Errorf("push env %v", push.Env)
	}
	for _, c := range []corev1.Container{in, push} {
		if !reflect.DeepEqual(c.SecurityContext, Hardened()) {
			t.Errorf("%s security %+v, want HARDENED", c.Name, c.SecurityContext)
		}
	}
	var secret *corev1.SecretVolumeSource
	for _, v := range s.Volumes {
		if v.Secret != nil {
			secret = v.Secret
		}
	}
	if secret == nil || secret.SecretName != "push" || secret.Items[0].Key != ".dockerconfigjson" || secret.Items[0].Path != "config.json" {
		t.Errorf("push secret volume %+v", secret)
	}
	p := testBuildParams(BuilderLayer)
	p.Insecure, p.PushSecret = true, ""
	job, _, err := BuildJob(p, testBuildSpec())
	if err != nil {
		t.Fatal(err)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if c.Command[len(c.Command)-1] != "--insecure" || len(c.Env) != 0 || mountMap(c)["/docker"] != "" {
		t.Errorf("insecure, no secret: %v env %v mounts %v", c.Command, c.Env, mountMap(c))
	}
}

func TestBuildJobKaniko(t *testing.T) {
	s, cm := checkJob(t, BuilderKaniko)
	var dockerfile string
	var items []string
	for _, v := range s.Volumes {
		if v.ConfigMap != nil {
			for _, it := range v.ConfigMap.Items {
				items = append(items, it.Path)
				if it.Path == "Dockerfile" {
					dockerfile = string(cm.BinaryData[it.Key])
				}
			}
		}
	}
	want := "FROM telorun/node:1.4.0\nWORKDIR /app\nCOPY . /app\nARG TELO_REGISTRY_URL\nENV TELO_REGISTRY_URL=$TELO_REGISTRY_URL\nENV TELO_CACHE_DIR=/telo-cache\nRUN telo install /app/telo.yaml\n"
	if dockerfile != want {
		t.Errorf("Dockerfile %q\nwant %q (items %v)", dockerfile, want, items)
	}
	if len(s.InitContainers) != 1 || s.InitContainers[0].Image != "busybox:stable" || mountMap(s.InitContainers[0])["/workspace"] != "workspace" {
		t.Fatalf("context init container %+v", s.InitContainers)
	}
	k := s.Containers[0]
	wantArgs := []string{"--context=dir:///workspace", "--dockerfile=/workspace/Dockerfile", "--destination=" + testBuildSpec().Ref,
		"--build-arg=TELO_REGISTRY_URL=https://registry.telo.run"}
	if k.Image != "ghcr.io/telorunner/telo-layer:test" || !slices.Equal(k.Args, wantArgs) {
		t.Errorf("kaniko %s %v", k.Image, k.Args)
	}
	if m := mountMap(k); m["/kaniko/.docker"] != "push-secret:ro" || m["/workspace"] != "workspace" {
		t.Errorf("kaniko mounts %v", m)
	}
	p := testBuildParams(BuilderKaniko)
	p.Insecure = true
	job, _, _ := BuildJob(p, testBuildSpec())
	if !strings.Contains(strings.Join(job.Spec.Template.Spec.Containers[0].Args, " "), "--insecure --insecure-pull") {
		t.Errorf("insecure kaniko args %v", job.Spec.Template.Spec.Containers[0].Args)
	}
	if _, _, err := BuildJob(BuildParams{Builder: "docker", TimeoutSeconds: 1}, testBuildSpec()); err == nil {
		t.Error("unknown builder accepted")
	}
}

func TestRunBuilt(t *testing.T) {
	spec := backend.Spec{SessionID: "s1", Mode: contract.ModeRun, Inspect: true,
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: "x"}}},
		Config: contract.SessionConfig{PullPolicy: "always", Image: "telorun/node:1.4.0"},
		Env:    map[string]string{"TELO_CACHE_DIR": "/evil", "A": "1"}}
	pod, _, err := RunBuilt(testParams(), spec, "reg.example/apps:abc")
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if c.Image != "reg.example/apps:abc" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s %s", c.Image, c.ImagePullPolicy)
	}
	want := []string{"telo", "run", "--no-cache-write", "--inspect", "0.0.0.0:9230", "--no-open", "/app/telo.yaml"}
	if !slices.Equal(c.Command, want) {
		t.Errorf("command %v, want %v (flags before the path)", c.Command, want)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["TELO_CACHE_DIR"] != "/telo-cache" || env["A"] != "1" {
		t.Errorf("env %v", env)
	}
	if *c.SecurityContext.ReadOnlyRootFilesystem != true {
		t.Error("root filesystem (holding /telo-cache) is not read-only")
	}
	// Without a build: the request's image and pull policy, no cache dir.
	pod, _, _ = Run(testParams(), spec)
	c = pod.Spec.Containers[0]
	if c.Image != "telorun/node:1.4.0" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("unbuilt image %s %s", c.Image, c.ImagePullPolicy)
	}
	for _, e := range c.Env {
		if e.Name == "TELO_CACHE_DIR" {
			t.Error("TELO_CACHE_DIR on an unbuilt run pod")
		}
	}
}
