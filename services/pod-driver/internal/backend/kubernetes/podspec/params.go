package podspec

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Labels and label values every session object carries (contract 11.1).
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelSession   = "telo.run/session-id"
	LabelMode      = "telo.run/mode"
	ModeWatch      = "watch"
)

// Fixed paths, ports and ids of the pod shapes (contract 11.3, 11.4).
const (
	WorkspacePort    = 8099
	FirstInspectPort = 9230
	RunUser          = 1000
	ContainerSession = "session"
	ContainerWS      = "workspace"
	ContainerAgent   = "agent"
	AppContainerPfx  = "app-"
)

// Limits is one ceiling set (contract 11.2).
type Limits struct {
	CPU, Memory, EphemeralStorage string
	TTLSeconds                    int64
}

// Validate checks every quantity parses as the contract says.
func (l Limits) Validate() error {
	if _, err := ParseCPU(l.CPU); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if _, err := ParseBytes(l.Memory); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if _, err := ParseBytes(l.EphemeralStorage); err != nil {
		return fmt.Errorf("ephemeral storage: %w", err)
	}
	for _, q := range []string{l.CPU, l.Memory, l.EphemeralStorage} {
		if _, err := resource.ParseQuantity(q); err != nil {
			return fmt.Errorf("quantity %q is not a Kubernetes quantity: %w", q, err)
		}
	}
	if l.TTLSeconds <= 0 {
		return errors.New("ttl seconds must be positive")
	}
	return nil
}

// Params is what the builders need beyond the session's spec: runner
// configuration (contract 18.2).
type Params struct {
	Namespace       string
	ManagedBy       string
	KernelImage     string // default kernel image (run and watch apps)
	WorkspaceImage  string // the workspace container's image
	RuntimeClass    string // "" for none
	ImagePullSecret string // "" for none
	RunLimits       Limits
	AppLimits       Limits // app sessions; per container in watch pods
	WatchTTLSeconds int64  // activeDeadlineSeconds of a watch pod
	// Ingress: BaseDomain "" means logs-only (no Service, no Ingress).
	BaseDomain, IngressClass, TLSSecret string
}

// Validate reports the first unusable field.
func (p Params) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"Namespace", p.Namespace}, {"ManagedBy", p.ManagedBy},
		{"KernelImage", p.KernelImage}, {"WorkspaceImage", p.WorkspaceImage},
	} {
		if f.v == "" {
			return fmt.Errorf("podspec: %s is empty", f.name)
		}
	}
	if err := p.RunLimits.Validate(); err != nil {
		return fmt.Errorf("podspec: run limits: %w", err)
	}
	if err := p.AppLimits.Validate(); err != nil {
		return fmt.Errorf("podspec: app limits: %w", err)
	}
	if p.WatchTTLSeconds <= 0 {
		return errors.New("podspec: WatchTTLSeconds must be positive")
	}
	return nil
}
