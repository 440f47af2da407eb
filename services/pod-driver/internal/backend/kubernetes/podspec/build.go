package podspec

import (
	"fmt"
	"path"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Builders (RUNNER_BUILDER).
const (
	// BuilderLayer: the base image installs the bundle's dependencies
	// (telo install) and telo-layer, our program, appends /app and
	// /telo-cache to the base image as one layer and pushes it. No
	// daemon, no privilege, every container HARDENED.
	BuilderLayer = "layer"
	// BuilderKaniko: the reference's Kaniko Job (contract 11.11 step 5).
	BuilderKaniko = "kaniko"
)

// Build Job constants.
const (
	LabelBuild             = "telo.run/build"
	BuildTTLAfterFinished  = 300 // ttlSecondsAfterFinished (11.11)
	ContainerInstall       = "install"
	ContainerPush          = "push"
	ContainerContext       = "context"
	ContainerKaniko        = "kaniko"
	LayerProgram           = "telo-layer" // the program of the layer builder image
	DockerConfigDir        = "/docker"    // the push secret of the layer builder (DOCKER_CONFIG)
	KanikoDockerConfigDir  = "/kaniko/.docker"
	TeloCacheDir           = "/telo-cache"
	dockerConfigSecretKey  = ".dockerconfigjson"
	buildBundleVolume      = "bundle"
	buildCacheVolume       = "telo-cache"
	buildDockerConfigVol   = "push-secret"
	buildWorkspaceVolume   = "workspace"
	kanikoContextMountPath = "/context"
)

// BuildJobName is the build Job of tag, and of its context ConfigMap
// (contract 11.1).
func BuildJobName(tag string) string { return "telo-build-" + tag }

// BuildParams configures build Jobs (contract 18.2).
type BuildParams struct {
	Namespace      string // RUNNER_BUILD_NAMESPACE
	ManagedBy      string
	Builder        string // BuilderLayer or BuilderKaniko
	BuilderImage   string // RUNNER_BUILDER_IMAGE
	InitImage      string // RUNNER_INIT_IMAGE: the Kaniko context copy
	TimeoutSeconds int64  // RUNNER_BUILD_TIMEOUT_SECONDS: activeDeadlineSeconds
	Insecure       bool   // RUNNER_REGISTRY_INSECURE
	PushSecret     string // RUNNER_REGISTRY_PUSH_SECRET (dockerconfigjson, in Namespace)
	RuntimeClass   string // RUNNER_RUNTIME_CLASS: telo install runs the bundle's dependencies' code
	Limits         Limits // per container (the app ceilings)
}

// BuildSpec is one image build.
type BuildSpec struct {
	Tag, Ref        string
	BaseImage       string
	Entry           string // the bundle's entry, normalized
	TeloRegistryURL string // "" when none
	Files           []contract.BundleFile
}

// Dockerfile is the Kaniko build context's Dockerfile (11.11 step 5).
func Dockerfile(base, entry string) string {
	return strings.Join([]string{
		"FROM " + base,
		"WORKDIR /app",
		"COPY . /app",
		"ARG TELO_REGISTRY_URL",
		"ENV TELO_REGISTRY_URL=$TELO_REGISTRY_URL",
		"ENV TELO_CACHE_DIR=" + TeloCacheDir,
		"RUN telo install " + path.Join("/app", entry),
	}, "\n") + "\n"
}

func buildLabels(p BuildParams) map[string]string {
	return map[string]string{LabelManagedBy: p.ManagedBy, LabelBuild: "true"}
}

// BuildJob is the Job telo-build-<tag> in the build namespace and the
// ConfigMap of the same name delivering its bundle (the caller creates
// the ConfigMap first and makes the Job its owner). BuilderLayer:
//
//   - init container install (the base image): telo install
//     /app/<entry> with TELO_CACHE_DIR=/telo-cache (an emptyDir); /app is
//     the bundle ConfigMap, read-only, as run pods mount it;
//   - container push (RUNNER_BUILDER_IMAGE, telo-layer): appends /app and
//     /telo-cache as one layer onto the base image and pushes the ref,
//     with the push secret mounted at /docker (DOCKER_CONFIG). The secret
//     reaches only this container, never the one that runs the
//     dependencies' install code.
//
// BuilderKaniko: the reference's Kaniko Job: an init container copies the
// context (bundle + Dockerfile) into /workspace, Kaniko builds and pushes
// it with the push secret at /kaniko/.docker/config.json. Kaniko needs
// root and a writable root filesystem, so its container is not HARDENED.
func BuildJob(p BuildParams, b BuildSpec) (*batchv1.Job, *corev1.ConfigMap, error) {
	entry, err := contract.NormalizePath(b.Entry)
	if err != nil {
		return nil, nil, fmt.Errorf("entry: %w", err)
	}
	if p.TimeoutSeconds <= 0 {
		return nil, nil, fmt.Errorf("build timeout must be positive")
	}
	name := BuildJobName(b.Tag)
	meta := metav1.ObjectMeta{Name: name, Namespace: p.Namespace, Labels: buildLabels(p)}
	var extra map[string][]byte
	if p.Builder == BuilderKaniko {
		extra = map[string][]byte{"Dockerfile": []byte(Dockerfile(b.BaseImage, entry))}
	}
	cm, items, err := bundleConfigMap(meta, b.Files, extra)
	if err != nil {
		return nil, nil, err
	}
	spec := corev1.PodSpec{
		RestartPolicy:                corev1.RestartPolicyNever,
		AutomountServiceAccountToken: new(false),
		EnableServiceLinks:           new(false),
		Volumes: []corev1.Volume{{Name: buildBundleVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}, Items: items,
		}}}},
	}
	if p.RuntimeClass != "" {
		spec.RuntimeClassName = new(p.RuntimeClass)
	}
	secretVolume := func(dir string) []corev1.VolumeMount {
		if p.PushSecret == "" {
			return nil
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: buildDockerConfigVol, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: p.PushSecret, Items: []corev1.KeyToPath{{Key: dockerConfigSecretKey, Path: "config.json"}},
		}}})
		return []corev1.VolumeMount{{Name: buildDockerConfigVol, MountPath: dir, ReadOnly: true}}
	}
	switch p.Builder {
	case BuilderLayer, "":
		spec.SecurityContext = podSecurity()
		for _, v := range []string{buildCacheVolume, "home", "tmp", "work"} {
			spec.Volumes = append(spec.Volumes, emptyDir(v))
		}
		env := map[string]string{"TELO_CACHE_DIR": TeloCacheDir, "HOME": "/home/telo", "npm_config_cache": "/home/telo/.npm"}
		if b.TeloRegistryURL != "" {
			env["TELO_REGISTRY_URL"] = b.TeloRegistryURL
		}
		spec.InitContainers = []corev1.Container{{
			Name:       ContainerInstall,
			Image:      b.BaseImage,
			WorkingDir: "/work",
			Command:    []string{"telo", "install", path.Join("/app", entry)},
			Env:        envVars(env),
			Resources:  resources(p.Limits),
			VolumeMounts: []corev1.VolumeMount{
				{Name: buildBundleVolume, MountPath: "/app", ReadOnly: true},
				{Name: buildCacheVolume, MountPath: TeloCacheDir},
				{Name: "home", MountPath: "/home/telo"}, {Name: "tmp", MountPath: "/tmp"}, {Name: "work", MountPath: "/work"},
			},
			SecurityContext: Hardened(),
		}}
		cmd := []string{LayerProgram, "--base", b.BaseImage, "--dest", b.Ref, "--app", "/app", "--cache", TeloCacheDir}
		if p.Insecure {
			cmd = append(cmd, "--insecure")
		}
		push := corev1.Container{
			Name:      ContainerPush,
			Image:     p.BuilderImage,
			Command:   cmd,
			Resources: resources(p.Limits),
			VolumeMounts: []corev1.VolumeMount{
				{Name: buildBundleVolume, MountPath: "/app", ReadOnly: true},
				{Name: buildCacheVolume, MountPath: TeloCacheDir, ReadOnly: true},
				{Name: "tmp", MountPath: "/tmp"},
			},
			SecurityContext: Hardened(),
		}
		if m := secretVolume(DockerConfigDir); m != nil {
			push.VolumeMounts = append(push.VolumeMounts, m...)
			push.Env = []corev1.EnvVar{{Name: "DOCKER_CONFIG", Value: DockerConfigDir}}
		}
		spec.Containers = []corev1.Container{push}
	case BuilderKaniko:
		spec.Volumes = append(spec.Volumes, emptyDir(buildWorkspaceVolume))
		spec.InitContainers = []corev1.Container{{
			Name:    ContainerContext,
			Image:   p.InitImage,
			Command: []string{"sh", "-c"},
			// The ConfigMap volume holds the kubelet's ..data links: -L
			// copies what they point at, then they go.
			Args: []string{"set -e; cp -RL " + kanikoContextMountPath + "/. /workspace/; rm -rf /workspace/..?*"},
			VolumeMounts: []corev1.VolumeMount{
				{Name: buildBundleVolume, MountPath: kanikoContextMountPath, ReadOnly: true},
				{Name: buildWorkspaceVolume, MountPath: "/workspace"},
			},
			SecurityContext: Hardened(),
		}}
		args := []string{"--context=dir:///workspace", "--dockerfile=/workspace/Dockerfile", "--destination=" + b.Ref,
			"--build-arg=TELO_REGISTRY_URL=" + b.TeloRegistryURL}
		if p.Insecure {
			args = append(args, "--insecure", "--insecure-pull", "--skip-tls-verify", "--skip-tls-verify-pull")
		}
		k := corev1.Container{
			Name:         ContainerKaniko,
			Image:        p.BuilderImage,
			Args:         args,
			Resources:    resources(p.Limits),
			VolumeMounts: []corev1.VolumeMount{{Name: buildWorkspaceVolume, MountPath: "/workspace"}},
		}
		k.VolumeMounts = append(k.VolumeMounts, secretVolume(KanikoDockerConfigDir)...)
		spec.Containers = []corev1.Container{k}
	default:
		return nil, nil, fmt.Errorf("unknown builder %q (want %s or %s)", p.Builder, BuilderLayer, BuilderKaniko)
	}
	job := &batchv1.Job{
		ObjectMeta: meta,
		Spec: batchv1.JobSpec{
			BackoffLimit:            new(int32(0)),
			ActiveDeadlineSeconds:   new(p.TimeoutSeconds),
			TTLSecondsAfterFinished: new(int32(BuildTTLAfterFinished)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: buildLabels(p)},
				Spec:       spec,
			},
		},
	}
	return job, cm, nil
}

// JobOwnerRef makes job the controller of an object (its context
// ConfigMap goes with it).
func JobOwnerRef(job *batchv1.Job) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
		Controller: new(true), BlockOwnerDeletion: new(true),
	}
}
