package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes"
)

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadConfigKubernetesDefaults(t *testing.T) {
	c, err := LoadConfig(lookup(map[string]string{"RUNNER_BACKEND": "kubernetes"}))
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	k := c.Kube
	want := KubeConfig{
		Namespace: "telo-sessions", ManagedBy: "telo-k8s-runner",
		KernelImage: "telorun/node:latest-slim", WorkspaceImage: "telorunner/workspace-server:latest",
		RunLimits:          kubernetes.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
		AppLimits:          kubernetes.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
		WatchMaxTTLSeconds: 21600,
		BuildNamespace:     "telo-builds", Builder: "layer", BuilderImage: "ghcr.io/telorunner/telo-layer:dev",
		InitImage: "busybox:stable", BuildTimeout: 600 * time.Second,
	}
	if k != want {
		t.Errorf("Kube = %+v, want the contract's defaults (18.2, 11.2) %+v", k, want)
	}
}

func TestLoadConfigKubernetesOverrides(t *testing.T) {
	c, err := LoadConfig(lookup(map[string]string{
		"RUNNER_BACKEND": "kubernetes", "RUNNER_SESSION_NAMESPACE": "sess", "RUNNER_MANAGED_BY": "me",
		"RUNNER_IMAGE": "telorun/node:1.2.3", "RUNNER_WORKSPACE_IMAGE": "ws:1", "RUNNER_RUNTIME_CLASS": "gvisor",
		"RUNNER_IMAGE_PULL_SECRET": "pull", "SESSION_INGRESS_BASE_DOMAIN": "s.example", "SESSION_INGRESS_CLASS": "nginx",
		"SESSION_INGRESS_TLS_SECRET": "wild", "RUNNER_MAX_CPU": "100m", "RUNNER_MAX_MEMORY": "200Mi",
		"RUNNER_MAX_EPHEMERAL_STORAGE": "1G", "RUNNER_MAX_TTL_SECONDS": "60", "RUNNER_APP_MAX_CPU": "1",
		"RUNNER_APP_MAX_TTL_SECONDS": "120", "RUNNER_WATCH_MAX_TTL_SECONDS": "300", "KUBECONFIG": "/k/config",
		"RUNNER_RUN_START_DEADLINE_SECONDS": "30", "RUNNER_WATCH_START_DEADLINE_SECONDS": "600",
		"RUNNER_WORKSPACE_READY_SECONDS": "45", "RUNNER_RELAY_RETRY_MS": "250",
		"RUNNER_IMAGE_REPOSITORY": "reg.example/telo/apps/", "RUNNER_BUILD_NAMESPACE": "builds", "RUNNER_BUILDER": "kaniko",
		"RUNNER_INIT_IMAGE": "busybox:1", "RUNNER_BUILD_TIMEOUT_SECONDS": "90", "RUNNER_REGISTRY_INSECURE": "true",
		"RUNNER_REGISTRY_API_URL": "https://reg.example/", "RUNNER_REGISTRY_PUSH_SECRET": "push",
	}))
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	k := c.Kube
	want := KubeConfig{
		Namespace: "sess", ManagedBy: "me", KernelImage: "telorun/node:1.2.3", WorkspaceImage: "ws:1",
		RuntimeClass: "gvisor", ImagePullSecret: "pull", IngressBaseDomain: "s.example", IngressClass: "nginx", TLS: "wild",
		RunLimits:          kubernetes.Limits{CPU: "100m", Memory: "200Mi", EphemeralStorage: "1G", TTLSeconds: 60},
		AppLimits:          kubernetes.Limits{CPU: "1", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 120},
		WatchMaxTTLSeconds: 300, Kubeconfig: "/k/config",
		RunStartDeadline: 30 * time.Second, WatchStartDeadline: 600 * time.Second, WorkspaceReady: 45 * time.Second,
		ImageRepository: "reg.example/telo/apps", BuildNamespace: "builds", Builder: "kaniko",
		BuilderImage: "gcr.io/kaniko-project/executor:latest", InitImage: "busybox:1", BuildTimeout: 90 * time.Second,
		RegistryInsecure: true, RegistryAPIURL: "https://reg.example", PushSecret: "push",
	}
	if k != want {
		t.Errorf("Kube = %+v, want %+v", k, want)
	}
	// Only the literal true enables insecure registries (18.2).
	c2, err := LoadConfig(lookup(map[string]string{"RUNNER_BACKEND": "kubernetes", "RUNNER_REGISTRY_INSECURE": "1", "RUNNER_BUILDER_IMAGE": "me/layer:1"}))
	if err != nil || c2.Kube.RegistryInsecure || c2.Kube.BuilderImage != "me/layer:1" {
		t.Errorf("RUNNER_REGISTRY_INSECURE=1: %+v, %v", c2.Kube, err)
	}
	if c.RelayRetry != 250*time.Millisecond {
		t.Errorf("RelayRetry = %v, want 250ms", c.RelayRetry)
	}
}

// A bad value is refused at startup with the variable's name (the service
// exits 2 with it).
func TestLoadConfigKubernetesErrorsNameTheVariable(t *testing.T) {
	for _, tt := range []struct{ key, value string }{
		{"RUNNER_MAX_CPU", "lots"},
		{"RUNNER_MAX_MEMORY", "100 MB"},
		{"RUNNER_MAX_EPHEMERAL_STORAGE", "-1Gi"},
		{"RUNNER_MAX_TTL_SECONDS", "0"},
		{"RUNNER_APP_MAX_CPU", "1 core"},
		{"RUNNER_APP_MAX_MEMORY", "many"},
		{"RUNNER_APP_MAX_TTL_SECONDS", "soon"},
		{"RUNNER_WATCH_MAX_TTL_SECONDS", "-5"},
		{"RUNNER_RUN_START_DEADLINE_SECONDS", "0"},
		{"RUNNER_WATCH_START_DEADLINE_SECONDS", "1h"},
		{"RUNNER_WORKSPACE_READY_SECONDS", "100000"},
		{"RUNNER_RELAY_RETRY_MS", "1"},
		{"RUNNER_BUILDER", "docker"},
		{"RUNNER_BUILD_TIMEOUT_SECONDS", "0"},
		{"RUNNER_BACKEND", "docker"},
	} {
		vars := map[string]string{"RUNNER_BACKEND": "kubernetes", tt.key: tt.value}
		_, err := LoadConfig(lookup(vars))
		if err == nil || !strings.HasPrefix(err.Error(), tt.key+":") {
			t.Errorf("LoadConfig(%s=%q) = %v, want an error starting with %s:", tt.key, tt.value, err, tt.key)
		}
	}
}

// The kubernetes variables are not read by the local backend: a bad one
// does not stop it.
func TestLoadConfigLocalIgnoresKubernetes(t *testing.T) {
	c, err := LoadConfig(lookup(map[string]string{"RUNNER_MAX_CPU": "lots"}))
	if err != nil || c.Backend != "local" {
		t.Fatalf("LoadConfig() = %+v, %v; want the local backend", c, err)
	}
}
