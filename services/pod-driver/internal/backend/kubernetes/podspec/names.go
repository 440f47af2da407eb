package podspec

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// RunPodName is the name of a run or app session's pod, and of its
// Service and Ingress (contract 11.1).
func RunPodName(sessionID string) string { return "telo-run-" + sessionID }

// BundleConfigMapName is the name of a run session's bundle ConfigMap.
func BundleConfigMapName(sessionID string) string { return "telo-bundle-" + sessionID }

// Namer makes fresh watch pod names: telo-watch-<id>-<suffix>, suffix =
// base36 wall-clock milliseconds then a base36 per-process counter
// (contract 11.1). Safe for concurrent use.
type Namer struct {
	Now     func() time.Time // nil: time.Now
	counter atomic.Uint64
}

// WatchPodName returns a name no earlier call of this Namer returned.
func (n *Namer) WatchPodName(sessionID string) string {
	now := time.Now
	if n.Now != nil {
		now = n.Now
	}
	c := n.counter.Add(1)
	return "telo-watch-" + sessionID + "-" + strconv.FormatInt(now().UnixMilli(), 36) + strconv.FormatUint(c, 36)
}

// AppContainerName is the container of watch app name: app-<name> (11.4).
// A container name is a DNS label of at most 63 characters, and the contract
// allows app names of up to 63 (3.9), so a name longer than 59 becomes
// app-<its first 50 characters>-<8 hex of its SHA-256>: distinct names stay
// distinct and the pod is accepted.
func AppContainerName(app string) string {
	if len(AppContainerPfx)+len(app) <= 63 {
		return AppContainerPfx + app
	}
	sum := sha256.Sum256([]byte(app))
	return AppContainerPfx + strings.TrimRight(app[:50], "-") + "-" + hex.EncodeToString(sum[:4])
}

// PortName is the name of a container or Service port: "<proto>-<port>"
// (contract 19 item 27: unique even when one port is tcp and udp).
func PortName(p contract.PortMapping) string { return protocol(p) + "-" + strconv.Itoa(p.Port) }

func protocol(p contract.PortMapping) string {
	if strings.EqualFold(p.Protocol, "udp") {
		return "udp"
	}
	return "tcp"
}

// Host is the Ingress host of a tcp port (contract 11.8).
func Host(port int, sessionID, domain string) string {
	return strconv.Itoa(port) + "-" + sessionID + "." + domain
}

// ValidDNSLabel reports whether s is an RFC 1123 label (pod, container
// and Service names).
func ValidDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case r == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
