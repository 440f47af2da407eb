// Package identity resolves the user a container runs as from its pod's
// security contexts, as a kubelet and a container runtime do together, and
// switches a process to it.
//
// uid is the container's runAsUser, else the pod's, else 0 (a stand-in
// image has no USER); gid is runAsGroup likewise, else 0; the
// supplementary groups are the pod's fsGroup (when set) followed by its
// supplementalGroups. Groups the image's /etc/group would add for the user
// (supplementalGroupsPolicy Merge) do not exist here.
package identity

import (
	"fmt"
	"slices"
	"syscall"

	v1 "k8s.io/api/core/v1"
)

// Identity is the user and groups of a container's processes.
type Identity struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"` // supplementary groups
}

// Root reports whether the identity is uid 0.
func (id Identity) Root() bool { return id.UID == 0 }

// Resolve returns the identity c of pod runs as: container-level
// runAsUser/runAsGroup override the pod's.
func Resolve(pod *v1.Pod, c *v1.Container) Identity {
	var id Identity
	psc := pod.Spec.SecurityContext
	csc := c.SecurityContext
	if psc != nil && psc.RunAsUser != nil {
		id.UID = uint32(*psc.RunAsUser)
	}
	if csc != nil && csc.RunAsUser != nil {
		id.UID = uint32(*csc.RunAsUser)
	}
	if psc != nil && psc.RunAsGroup != nil {
		id.GID = uint32(*psc.RunAsGroup)
	}
	if csc != nil && csc.RunAsGroup != nil {
		id.GID = uint32(*csc.RunAsGroup)
	}
	if psc != nil {
		if psc.FSGroup != nil {
			id.Groups = append(id.Groups, uint32(*psc.FSGroup))
		}
		for _, g := range psc.SupplementalGroups {
			if !slices.Contains(id.Groups, uint32(g)) {
				id.Groups = append(id.Groups, uint32(g))
			}
		}
	}
	return id
}

// FSGroup returns the pod's fsGroup, if it has one.
func FSGroup(pod *v1.Pod) (uint32, bool) {
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		return uint32(*sc.FSGroup), true
	}
	return 0, false
}

// VerifyRunAsNonRoot refuses a container whose effective runAsNonRoot is
// true while it would run as uid 0, with the kubelet's messages (the
// kubelet reports them as CreateContainerConfigError). A stand-in image
// always runs as root unless runAsUser says otherwise.
func VerifyRunAsNonRoot(pod *v1.Pod, c *v1.Container) error {
	nonRoot := false
	var runAsUser *int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		nonRoot = sc.RunAsNonRoot != nil && *sc.RunAsNonRoot
		runAsUser = sc.RunAsUser
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			runAsUser = sc.RunAsUser
		}
	}
	if !nonRoot {
		return nil
	}
	who := fmt.Sprintf("(pod: %q, container: %s)", fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID), c.Name)
	if runAsUser != nil {
		if *runAsUser == 0 {
			return fmt.Errorf("container's runAsUser breaks non-root policy %s", who)
		}
		return nil
	}
	return fmt.Errorf("container has runAsNonRoot and image will run as root %s", who)
}

// Credential returns the identity as exec credentials: Go's fork sets
// the groups, then the gid, then the uid in the child.
func (id Identity) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: slices.Clone(id.Groups)}
}

// Apply switches the calling process to the identity: setgroups, setgid,
// then setuid, which Go applies to every thread of the process. Going
// from root to another uid drops every capability.
func (id Identity) Apply() error {
	groups := make([]int, len(id.Groups))
	for i, g := range id.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("set supplementary groups %v: %w", id.Groups, err)
	}
	if err := syscall.Setgid(int(id.GID)); err != nil {
		return fmt.Errorf("set gid %d: %w", id.GID, err)
	}
	if err := syscall.Setuid(int(id.UID)); err != nil {
		return fmt.Errorf("set uid %d: %w", id.UID, err)
	}
	return nil
}

// Home is HOME when the container's env does not set it: like runc for a
// user the image's /etc/passwd does not know, "/" — except root, which
// every image's passwd has with home /root.
func (id Identity) Home() string {
	if id.Root() {
		return "/root"
	}
	return "/"
}
