package podspec

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// envVars merges layers left to right (a later layer wins a name) and
// returns them sorted by name, so a spec is deterministic.
func envVars(layers ...map[string]string) []corev1.EnvVar {
	m := make(map[string]string)
	for _, l := range layers {
		maps.Copy(m, l)
	}
	out := make([]corev1.EnvVar, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, corev1.EnvVar{Name: k, Value: m[k]})
	}
	return out
}

// sessionEnv is the session's env without the names the runner owns in
// that container (contract 10.6: TELO_CACHE_DIR never reaches a watch
// app; infrastructure variables are the runner's).
func sessionEnv(env map[string]string, drop ...string) map[string]string {
	m := maps.Clone(env)
	for _, k := range drop {
		delete(m, k)
	}
	return m
}
