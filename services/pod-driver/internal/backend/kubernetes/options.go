package kubernetes

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// Defaults applied by New to zero Options fields (contract 11, 18.2).
const (
	DefaultNamespace          = "telo-sessions"
	DefaultManagedBy          = "telo-k8s-runner"
	DefaultRunStartDeadline   = 120 * time.Second // 11.13
	DefaultWatchStartDeadline = 180 * time.Second // 11.5
	DefaultWorkspaceReady     = 120 * time.Second // 11.5 step 4
	DefaultWatchMaxTTL        = 21600

	// ClientQPS and ClientBurst are set on a rest.Config New builds a
	// client from. client-go's defaults (5/10) throttle a driver that runs
	// tens of sessions: every session is a create, a watch, an attach per
	// app, Service and Ingress writes and re-arms; a burst of starts after
	// a failover would queue for seconds. 50/100 keeps one driver well
	// under the API server's default max-in-flight (400) while never
	// throttling a normal start.
	ClientQPS   = 50
	ClientBurst = 100

	// Build path (11.11, 18.2).
	DefaultBuildNamespace = "telo-builds"
	DefaultBuilder        = podspec.BuilderLayer
	DefaultBuildTimeout   = 600 * time.Second
	DefaultInitImage      = "busybox:stable"
	DefaultKanikoImage    = "gcr.io/kaniko-project/executor:latest"
	// DefaultLayerImage is the layer builder's image without its tag:
	// `make images` builds it (tools/images, telo-layer).
	DefaultLayerImage = "ghcr.io/telorunner/telo-layer"
	// DefaultBuildPoll is how often a build Job is polled (11.11 step 6).
	DefaultBuildPoll = 2 * time.Second
)

// Limits is one ceiling set (contract 11.2).
type Limits = podspec.Limits

// Options configures a Backend.
type Options struct {
	// Client talks to the API server. When nil it is built from
	// RestConfig (with ClientQPS/ClientBurst).
	Client k8s.Interface
	// RestConfig is required: pods/attach needs it for the WebSocket
	// executor.
	RestConfig *rest.Config
	Namespace  string // RUNNER_SESSION_NAMESPACE
	ManagedBy  string // RUNNER_MANAGED_BY

	KernelImage     string // RUNNER_IMAGE: run pods and watch apps
	WorkspaceImage  string // the workspace-server image of watch pods
	RuntimeClass    string // RUNNER_RUNTIME_CLASS
	ImagePullSecret string // RUNNER_IMAGE_PULL_SECRET

	IngressBaseDomain string // SESSION_INGRESS_BASE_DOMAIN; "" = logs-only
	IngressClass      string // SESSION_INGRESS_CLASS
	TLSSecret         string // SESSION_INGRESS_TLS_SECRET

	RunLimits          Limits // RUNNER_MAX_*
	AppLimits          Limits // RUNNER_APP_MAX_*
	WatchMaxTTLSeconds int64  // RUNNER_WATCH_MAX_TTL_SECONDS

	// StartDeadline bounds reaching Running for every pod when set; else
	// RunStartDeadline (0: 120 s) and WatchStartDeadline (0: 180 s) do.
	StartDeadline      time.Duration
	RunStartDeadline   time.Duration // RUNNER_RUN_START_DEADLINE_SECONDS
	WatchStartDeadline time.Duration // RUNNER_WATCH_START_DEADLINE_SECONDS
	WorkspaceReady     time.Duration // RUNNER_WORKSPACE_READY_SECONDS; 0: 120 s
	// Reach times the reachability watchers (zero: contract 11.7).
	Reach kernelwire.ReachTiming
	// Build path of run sessions (contract 11.11). ImageRepository ""
	// turns it off: run pods then use the session's base image.
	ImageRepository  string        // RUNNER_IMAGE_REPOSITORY
	BuildNamespace   string        // RUNNER_BUILD_NAMESPACE (telo-builds)
	Builder          string        // RUNNER_BUILDER: layer (default) or kaniko
	BuilderImage     string        // RUNNER_BUILDER_IMAGE (required for layer; kaniko: DefaultKanikoImage)
	InitImage        string        // RUNNER_INIT_IMAGE (busybox:stable): the Kaniko context copy
	BuildTimeout     time.Duration // RUNNER_BUILD_TIMEOUT_SECONDS (600 s)
	RegistryInsecure bool          // RUNNER_REGISTRY_INSECURE
	RegistryAPIURL   string        // RUNNER_REGISTRY_API_URL: "" = no existence check (always build)
	PushSecret       string        // RUNNER_REGISTRY_PUSH_SECRET (in BuildNamespace)
	// BuildLocks is the single-flight of builds across drivers; nil
	// leaves only the Job name (a 409 on create waits for the peer).
	BuildLocks *imagebuild.Locks
	// BuildPoll is the Job poll period (0: 2 s).
	BuildPoll time.Duration
	// RelayRetry is the debug relay's reconnect pause (0: 500 ms).
	RelayRetry time.Duration
	Logger     *slog.Logger
}

// Validate reports the first unusable field.
func (o Options) Validate() error {
	if o.RestConfig == nil {
		return errors.New("kubernetes backend: RestConfig is nil")
	}
	if o.KernelImage == "" || o.WorkspaceImage == "" {
		return errors.New("kubernetes backend: KernelImage and WorkspaceImage are required")
	}
	if err := o.RunLimits.Validate(); err != nil {
		return fmt.Errorf("kubernetes backend: run limits: %w", err)
	}
	if err := o.AppLimits.Validate(); err != nil {
		return fmt.Errorf("kubernetes backend: app limits: %w", err)
	}
	switch o.Builder {
	case "", podspec.BuilderLayer, podspec.BuilderKaniko:
	default:
		return fmt.Errorf("kubernetes backend: builder %q: want %s or %s", o.Builder, podspec.BuilderLayer, podspec.BuilderKaniko)
	}
	if o.ImageRepository != "" && o.BuilderImage == "" && o.Builder != podspec.BuilderKaniko {
		return errors.New("kubernetes backend: the layer builder needs BuilderImage (RUNNER_BUILDER_IMAGE)")
	}
	if o.BuildTimeout < 0 || o.BuildPoll < 0 || o.StartDeadline < 0 || o.RunStartDeadline < 0 || o.WatchStartDeadline < 0 || o.WorkspaceReady < 0 || o.RelayRetry < 0 {
		return errors.New("kubernetes backend: negative duration")
	}
	return nil
}

func (o *Options) applyDefaults() {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ManagedBy == "" {
		o.ManagedBy = DefaultManagedBy
	}
	if o.WatchMaxTTLSeconds == 0 {
		o.WatchMaxTTLSeconds = DefaultWatchMaxTTL
	}
	if o.WorkspaceReady == 0 {
		o.WorkspaceReady = DefaultWorkspaceReady
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.BuildNamespace == "" {
		o.BuildNamespace = DefaultBuildNamespace
	}
	if o.Builder == "" {
		o.Builder = DefaultBuilder
	}
	if o.BuilderImage == "" && o.Builder == podspec.BuilderKaniko {
		o.BuilderImage = DefaultKanikoImage
	}
	if o.InitImage == "" {
		o.InitImage = DefaultInitImage
	}
	if o.BuildTimeout == 0 {
		o.BuildTimeout = DefaultBuildTimeout
	}
	if o.BuildPoll == 0 {
		o.BuildPoll = DefaultBuildPoll
	}
}

func (o Options) buildParams() podspec.BuildParams {
	return podspec.BuildParams{
		Namespace: o.BuildNamespace, ManagedBy: o.ManagedBy, Builder: o.Builder,
		BuilderImage: o.BuilderImage, InitImage: o.InitImage,
		TimeoutSeconds: int64(o.BuildTimeout / time.Second), Insecure: o.RegistryInsecure,
		PushSecret: o.PushSecret, RuntimeClass: o.RuntimeClass, Limits: o.AppLimits,
	}
}

func (o Options) startDeadline(watch bool) time.Duration {
	switch {
	case o.StartDeadline > 0:
		return o.StartDeadline
	case watch && o.WatchStartDeadline > 0:
		return o.WatchStartDeadline
	case watch:
		return DefaultWatchStartDeadline
	case o.RunStartDeadline > 0:
		return o.RunStartDeadline
	default:
		return DefaultRunStartDeadline
	}
}

// WithThrottle returns a copy of cfg with QPS and Burst set to
// ClientQPS/ClientBurst unless cfg sets them already.
func WithThrottle(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	if c.QPS == 0 {
		c.QPS = ClientQPS
	}
	if c.Burst == 0 {
		c.Burst = ClientBurst
	}
	return c
}

func (o Options) params() podspec.Params {
	return podspec.Params{
		Namespace: o.Namespace, ManagedBy: o.ManagedBy,
		KernelImage: o.KernelImage, WorkspaceImage: o.WorkspaceImage,
		RuntimeClass: o.RuntimeClass, ImagePullSecret: o.ImagePullSecret,
		RunLimits: o.RunLimits, AppLimits: o.AppLimits, WatchTTLSeconds: o.WatchMaxTTLSeconds,
		BaseDomain: o.IngressBaseDomain, IngressClass: o.IngressClass, TLSSecret: o.TLSSecret,
	}
}
