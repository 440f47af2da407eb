package podspec

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Hardened is the contract's HARDENED container security context (11.3).
func Hardened() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		RunAsNonRoot:             new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// relaxed is the security context of operator images (app session
// container, agent): they may write their own filesystem.
func relaxed() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// podSecurity is the pod security context of run and watch pods: one
// non-root user and a shared fsGroup (11.3, 11.4).
func podSecurity() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   new(true),
		RunAsUser:      new(int64(RunUser)),
		RunAsGroup:     new(int64(RunUser)),
		FSGroup:        new(int64(RunUser)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// resources is l as limits, cpu and memory also as requests (11.2).
func resources(l Limits) corev1.ResourceRequirements {
	cpu := resource.MustParse(l.CPU)
	mem := resource.MustParse(l.Memory)
	return corev1.ResourceRequirements{
		Limits: corev1.ResourceList{
			corev1.ResourceCPU:              cpu,
			corev1.ResourceMemory:           mem,
			corev1.ResourceEphemeralStorage: resource.MustParse(l.EphemeralStorage),
		},
		Requests: corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem},
	}
}

// PullPolicy maps a contract pull policy to Kubernetes' (11.6); anything
// else is IfNotPresent.
func PullPolicy(p string) corev1.PullPolicy {
	switch p {
	case "always":
		return corev1.PullAlways
	case "never":
		return corev1.PullNever
	default:
		return corev1.PullIfNotPresent
	}
}
