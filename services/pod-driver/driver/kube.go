package driver

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/version"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// KubeConfig is the kubernetes backend's configuration (contract 18.2).
type KubeConfig struct {
	Namespace, ManagedBy                 string
	KernelImage, WorkspaceImage          string
	RuntimeClass, ImagePullSecret        string
	IngressBaseDomain, IngressClass, TLS string
	RunLimits, AppLimits                 kubernetes.Limits
	WatchMaxTTLSeconds                   int64
	// The contract's fixed deadlines, configurable (19 item 34); zero
	// means the contract's value.
	RunStartDeadline, WatchStartDeadline, WorkspaceReady time.Duration
	// Build path (contract 11.11, 18.2); ImageRepository "" turns it off.
	ImageRepository, BuildNamespace, Builder, BuilderImage, InitImage string
	BuildTimeout                                                      time.Duration
	RegistryInsecure                                                  bool
	RegistryAPIURL, PushSecret                                        string
	// Kubeconfig is KUBECONFIG; in a cluster (KUBERNETES_SERVICE_HOST set)
	// the in-cluster credentials are used instead.
	Kubeconfig string
}

func loadKubeConfig(get func(string) string) (KubeConfig, error) {
	or := func(k, def string) string {
		if v := get(k); v != "" {
			return v
		}
		return def
	}
	c := KubeConfig{
		Namespace: or("RUNNER_SESSION_NAMESPACE", kubernetes.DefaultNamespace), ManagedBy: or("RUNNER_MANAGED_BY", kubernetes.DefaultManagedBy),
		KernelImage: or("RUNNER_IMAGE", "telorun/node:latest-slim"), WorkspaceImage: or("RUNNER_WORKSPACE_IMAGE", "telorunner/workspace-server:latest"),
		RuntimeClass: get("RUNNER_RUNTIME_CLASS"), ImagePullSecret: get("RUNNER_IMAGE_PULL_SECRET"),
		IngressBaseDomain: get("SESSION_INGRESS_BASE_DOMAIN"), IngressClass: get("SESSION_INGRESS_CLASS"), TLS: get("SESSION_INGRESS_TLS_SECRET"),
		Kubeconfig:      get("KUBECONFIG"),
		ImageRepository: strings.TrimRight(get("RUNNER_IMAGE_REPOSITORY"), "/"), BuildNamespace: or("RUNNER_BUILD_NAMESPACE", kubernetes.DefaultBuildNamespace),
		Builder: or("RUNNER_BUILDER", kubernetes.DefaultBuilder), BuilderImage: get("RUNNER_BUILDER_IMAGE"), InitImage: or("RUNNER_INIT_IMAGE", kubernetes.DefaultInitImage),
		BuildTimeout: kubernetes.DefaultBuildTimeout, RegistryInsecure: get("RUNNER_REGISTRY_INSECURE") == "true",
		RegistryAPIURL: strings.TrimRight(get("RUNNER_REGISTRY_API_URL"), "/"), PushSecret: get("RUNNER_REGISTRY_PUSH_SECRET"),
	}
	switch c.Builder {
	case podspec.BuilderLayer:
		if c.BuilderImage == "" {
			// The telo-layer image of this release (make images).
			c.BuilderImage = kubernetes.DefaultLayerImage + ":" + strings.TrimPrefix(version.Version, "v")
		}
	case podspec.BuilderKaniko:
		if c.BuilderImage == "" {
			c.BuilderImage = kubernetes.DefaultKanikoImage
		}
	default:
		return c, fmt.Errorf("RUNNER_BUILDER: must be %s or %s, got %q", podspec.BuilderLayer, podspec.BuilderKaniko, c.Builder)
	}
	bt := envconf.NewGetenv(get)
	if bt.Duration("RUNNER_BUILD_TIMEOUT_SECONDS", time.Second, 1, 86400, &c.BuildTimeout); bt.Err() != nil {
		return c, bt.Err()
	}
	limits := func(prefix string, def kubernetes.Limits) (kubernetes.Limits, error) {
		l := kubernetes.Limits{CPU: or(prefix+"CPU", def.CPU), Memory: or(prefix+"MEMORY", def.Memory),
			EphemeralStorage: or(prefix+"EPHEMERAL_STORAGE", def.EphemeralStorage), TTLSeconds: def.TTLSeconds}
		e := envconf.NewGetenv(get)
		if e.Int64(prefix+"TTL_SECONDS", 1, envconf.NoMax, &l.TTLSeconds); e.Err() != nil {
			return l, e.Err()
		}
		// Name the one variable at fault (exit 2 names it, 18.2).
		for _, f := range []struct{ name, v string }{{"CPU", l.CPU}, {"MEMORY", l.Memory}, {"EPHEMERAL_STORAGE", l.EphemeralStorage}} {
			only := kubernetes.Limits{CPU: "1", Memory: "1", EphemeralStorage: "1", TTLSeconds: 1}
			switch f.name {
			case "CPU":
				only.CPU = f.v
			case "MEMORY":
				only.Memory = f.v
			default:
				only.EphemeralStorage = f.v
			}
			if err := only.Validate(); err != nil {
				return l, fmt.Errorf("%s%s: %w", prefix, f.name, err)
			}
		}
		return l, nil
	}
	var err error
	if c.RunLimits, err = limits("RUNNER_MAX_", kubernetes.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600}); err != nil {
		return c, err
	}
	if c.AppLimits, err = limits("RUNNER_APP_MAX_", kubernetes.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600}); err != nil {
		return c, err
	}
	c.WatchMaxTTLSeconds = kubernetes.DefaultWatchMaxTTL
	e := envconf.NewGetenv(get)
	e.Int64("RUNNER_WATCH_MAX_TTL_SECONDS", 1, envconf.NoMax, &c.WatchMaxTTLSeconds)
	e.Duration("RUNNER_RUN_START_DEADLINE_SECONDS", time.Second, 1, 86400, &c.RunStartDeadline)
	e.Duration("RUNNER_WATCH_START_DEADLINE_SECONDS", time.Second, 1, 86400, &c.WatchStartDeadline)
	e.Duration("RUNNER_WORKSPACE_READY_SECONDS", time.Second, 1, 86400, &c.WorkspaceReady)
	return c, e.Err()
}

// restConfig is in-cluster credentials when running in a pod, else the
// kubeconfig.
func (c KubeConfig) restConfig() (*rest.Config, error) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return rest.InClusterConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if c.Kubeconfig != "" {
		rules.ExplicitPath = strings.Split(c.Kubeconfig, string(os.PathListSeparator))[0]
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
}

func newKubeBackend(c KubeConfig, relayRetry time.Duration, locks *imagebuild.Locks, log *slog.Logger) (*kubernetes.Backend, error) {
	rc, err := c.restConfig()
	if err != nil {
		return nil, fmt.Errorf("KUBECONFIG: %w", err)
	}
	return kubernetes.New(kubernetes.Options{
		RestConfig: kubernetes.WithThrottle(rc), Namespace: c.Namespace, ManagedBy: c.ManagedBy,
		KernelImage: c.KernelImage, WorkspaceImage: c.WorkspaceImage, RuntimeClass: c.RuntimeClass, ImagePullSecret: c.ImagePullSecret,
		IngressBaseDomain: c.IngressBaseDomain, IngressClass: c.IngressClass, TLSSecret: c.TLS,
		RunLimits: c.RunLimits, AppLimits: c.AppLimits, WatchMaxTTLSeconds: c.WatchMaxTTLSeconds,
		RunStartDeadline: c.RunStartDeadline, WatchStartDeadline: c.WatchStartDeadline, WorkspaceReady: c.WorkspaceReady,
		ImageRepository: c.ImageRepository, BuildNamespace: c.BuildNamespace, Builder: c.Builder, BuilderImage: c.BuilderImage,
		InitImage: c.InitImage, BuildTimeout: c.BuildTimeout, RegistryInsecure: c.RegistryInsecure,
		RegistryAPIURL: c.RegistryAPIURL, PushSecret: c.PushSecret, BuildLocks: locks,
		RelayRetry: relayRetry, Logger: log,
	})
}
