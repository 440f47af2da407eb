package podspec

import (
	"encoding/base64"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// MaxBundleBytes bounds a run bundle delivered as a ConfigMap: the API
// server refuses objects over 1 MiB, and keys, paths and metadata need
// room.
const MaxBundleBytes = 1<<20 - 64<<10

// Scratch volumes (emptyDir) and their mount paths (11.3, 11.4).
var scratch = []struct{ name, path string }{
	{"work", "/work"}, {"home", "/home/telo"}, {"tmp", "/tmp"},
}

func objectMeta(p Params, name, sessionID string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: p.Namespace,
		Labels:    map[string]string{LabelManagedBy: p.ManagedBy, LabelSession: sessionID},
	}
}

func basePodSpec(p Params, ttl int64) corev1.PodSpec {
	s := corev1.PodSpec{
		RestartPolicy:                corev1.RestartPolicyNever,
		ActiveDeadlineSeconds:        new(ttl),
		AutomountServiceAccountToken: new(false),
		SecurityContext:              podSecurity(),
		EnableServiceLinks:           new(false), // no Service env leaks into workloads (10.6)
	}
	if p.ImagePullSecret != "" {
		s.ImagePullSecrets = []corev1.LocalObjectReference{{Name: p.ImagePullSecret}}
	}
	if p.RuntimeClass != "" {
		s.RuntimeClassName = new(p.RuntimeClass)
	}
	return s
}

// containerPorts documents ports (11.3: documentation only), one entry
// per protocol/port.
func containerPorts(ports []contract.PortMapping) []corev1.ContainerPort {
	ports = Dedupe(ports)
	if len(ports) == 0 {
		return nil
	}
	out := make([]corev1.ContainerPort, 0, len(ports))
	for _, pm := range ports {
		proto := corev1.ProtocolTCP
		if protocol(pm) == "udp" {
			proto = corev1.ProtocolUDP
		}
		out = append(out, corev1.ContainerPort{Name: PortName(pm), ContainerPort: int32(pm.Port), Protocol: proto})
	}
	return out
}

func image(cfg contract.SessionConfig, def string) string {
	if cfg.Image != "" {
		return cfg.Image
	}
	return def
}

// singleApp is the one app of a run or app session.
func singleApp(spec backend.Spec) (backend.App, error) {
	switch len(spec.Apps) {
	case 0:
		return backend.App{Name: contract.DefaultApp, Entry: spec.Bundle.EntryRelativePath, IO: contract.IOTTY}, nil
	case 1:
		return spec.Apps[0], nil
	default:
		return backend.App{}, fmt.Errorf("a run session has exactly one app, got %d", len(spec.Apps))
	}
}

// Run builds a run session's pod and the ConfigMap that delivers its
// bundle (contract 11.3, with the bundle as a ConfigMap volume at /app
// instead of the init container's fetch: see the package kubernetes
// doc). The ConfigMap has one binaryData key per file (f0, f1, …, valid
// keys whatever the path) mapped to the file's normalized path. The
// caller creates the ConfigMap first and owner-references it to the pod.
func Run(p Params, spec backend.Spec) (*corev1.Pod, *corev1.ConfigMap, error) {
	return run(p, spec, "")
}

// RunBuilt is Run on the session's built image ref (contract 11.3,
// 11.11): pulled IfNotPresent (the tag is content-addressed), with
// TELO_CACHE_DIR=/telo-cache, the dependency cache baked into the image's
// read-only root filesystem (--no-cache-write keeps the kernel from
// writing to it). The bundle still reaches /app through the ConfigMap
// (the mount covers the image's /app).
func RunBuilt(p Params, spec backend.Spec, ref string) (*corev1.Pod, *corev1.ConfigMap, error) {
	if ref == "" {
		return nil, nil, fmt.Errorf("built image ref is empty")
	}
	return run(p, spec, ref)
}

func run(p Params, spec backend.Spec, built string) (*corev1.Pod, *corev1.ConfigMap, error) {
	app, err := singleApp(spec)
	if err != nil {
		return nil, nil, err
	}
	entry, err := contract.NormalizePath(app.Entry)
	if err != nil {
		return nil, nil, fmt.Errorf("entry: %w", err)
	}
	cm, items, err := bundleConfigMap(objectMeta(p, BundleConfigMapName(spec.SessionID), spec.SessionID), spec.Bundle.Files, nil)
	if err != nil {
		return nil, nil, err
	}

	pod := &corev1.Pod{ObjectMeta: objectMeta(p, RunPodName(spec.SessionID), spec.SessionID)}
	ttl := p.RunLimits.TTLSeconds
	pod.Spec = basePodSpec(p, ttl)
	// The CLI's flags go before the path (10.1's later-revision order, A42):
	// newer CLIs hand every token after the path to the application.
	cmd := []string{"telo", "run", "--no-cache-write"}
	if spec.Inspect {
		cmd = append(cmd, "--inspect", "0.0.0.0:"+strconv.Itoa(FirstInspectPort), "--no-open")
	}
	cmd = append(cmd, path.Join("/app", entry))
	img, pull := image(spec.Config, p.KernelImage), PullPolicy(spec.Config.PullPolicy)
	env := map[string]string{"HOME": "/home/telo", "npm_config_cache": "/home/telo/.npm", "FORCE_COLOR": "1"}
	if built != "" {
		// The content-addressed per-app image: IfNotPresent, and the
		// cache baked into it.
		img, pull = built, corev1.PullIfNotPresent
		env["TELO_CACHE_DIR"] = TeloCacheDir
	}
	c := corev1.Container{
		Name:  ContainerSession,
		Image: img,
		// Without a build the image is the request's base image, so the
		// request's pull policy applies (the mapping of 11.6).
		ImagePullPolicy: pull,
		WorkingDir:      "/work",
		Command:         cmd,
		// Without a build there is no TELO_CACHE_DIR: 10.6's /telo-cache
		// is the dependency cache baked into a per-bundle image; on the
		// base image that path would be an empty directory on a
		// read-only root. The CLI keeps its default cache under HOME (a
		// writable emptyDir), and --no-cache-write still keeps derived
		// entries out of it.
		Env:             envVars(sessionEnv(spec.Env, "TELO_CACHE_DIR", "HOME", "npm_config_cache", "FORCE_COLOR"), env),
		Stdin:           true,
		TTY:             app.IO != contract.IOStreams,
		Ports:           containerPorts(app.Ports),
		Resources:       resources(p.RunLimits),
		VolumeMounts:    []corev1.VolumeMount{{Name: "app", MountPath: "/app", ReadOnly: true}},
		SecurityContext: Hardened(),
	}
	pod.Spec.Volumes = []corev1.Volume{{Name: "app", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name},
		Items:                items,
	}}}}
	for _, s := range scratch {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: s.name, MountPath: s.path})
		pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDir(s.name))
	}
	pod.Spec.Containers = []corev1.Container{c}
	return pod, cm, nil
}

// bundleConfigMap is a ConfigMap holding files (plus extra, already
// normalized paths) as binaryData keys f0, f1, … (valid keys whatever the
// path), and the items mapping each key to its path.
func bundleConfigMap(meta metav1.ObjectMeta, files []contract.BundleFile, extra map[string][]byte) (*corev1.ConfigMap, []corev1.KeyToPath, error) {
	cm := &corev1.ConfigMap{ObjectMeta: meta, BinaryData: map[string][]byte{}}
	items := make([]corev1.KeyToPath, 0, len(files)+len(extra))
	total := 0
	seen := make(map[string]bool)
	add := func(rel string, data []byte) error {
		if seen[rel] {
			return fmt.Errorf("bundle file %s appears twice", rel)
		}
		seen[rel] = true
		key := "f" + strconv.Itoa(len(items))
		cm.BinaryData[key] = data
		items = append(items, corev1.KeyToPath{Key: key, Path: rel})
		total += len(data) + len(rel) + len(key)
		return nil
	}
	for _, f := range files {
		rel, err := contract.NormalizePath(f.RelativePath)
		if err != nil {
			return nil, nil, err
		}
		data, err := BundleFileBytes(f)
		if err != nil {
			return nil, nil, err
		}
		if err := add(rel, data); err != nil {
			return nil, nil, err
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(extra)) {
		if err := add(rel, extra[rel]); err != nil {
			return nil, nil, err
		}
	}
	if total > MaxBundleBytes {
		return nil, nil, fmt.Errorf("bundle is %d bytes; a ConfigMap holds at most %d", total, MaxBundleBytes)
	}
	return cm, items, nil
}

// BundleFileBytes is a bundle file's decoded contents.
func BundleFileBytes(f contract.BundleFile) ([]byte, error) {
	if f.Encoding != "base64" {
		return []byte(f.Contents), nil
	}
	data, err := base64.StdEncoding.DecodeString(f.Contents)
	if err != nil {
		return nil, fmt.Errorf("decode bundle file %s: %w", f.RelativePath, err)
	}
	return data, nil
}

func emptyDir(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
}

// App builds an operator app session's pod (contract 11.6): the catalog
// image with its own entrypoint, the merged env, app ceilings, no
// volumes. Unlike the reference it sets pod-level runAsNonRoot (19 item
// 23) so the pod passes the restricted Pod Security Standard.
func App(p Params, spec backend.Spec) (*corev1.Pod, error) {
	app, err := singleApp(spec)
	if err != nil {
		return nil, err
	}
	if spec.Config.Image == "" {
		return nil, fmt.Errorf("an app session needs its catalog image")
	}
	pod := &corev1.Pod{ObjectMeta: objectMeta(p, RunPodName(spec.SessionID), spec.SessionID)}
	pod.Spec = basePodSpec(p, p.AppLimits.TTLSeconds)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot:   new(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	pod.Spec.Containers = []corev1.Container{{
		Name:            ContainerSession,
		Image:           spec.Config.Image,
		ImagePullPolicy: PullPolicy(spec.Config.PullPolicy),
		Env:             envVars(spec.Env, map[string]string{"FORCE_COLOR": "1"}),
		Stdin:           true,
		TTY:             app.IO != contract.IOStreams,
		Ports:           containerPorts(app.Ports),
		Resources:       resources(p.AppLimits),
		SecurityContext: relaxed(),
	}}
	return pod, nil
}
