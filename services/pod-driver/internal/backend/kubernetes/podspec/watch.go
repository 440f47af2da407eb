package podspec

import (
	"fmt"
	"path"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// WatchApps returns the apps of a watch spec (the default app when it
// lists none) with entries normalized, checked: names that make valid,
// unique container names, and ports unique across apps, the agent, the
// workspace port and the inspect ports (contract 11.4).
func WatchApps(spec backend.Spec) ([]backend.App, error) {
	apps := spec.Apps
	if len(apps) == 0 {
		apps = []backend.App{{Name: contract.DefaultApp, Entry: spec.Bundle.EntryRelativePath, IO: contract.IOTTY}}
	}
	out := make([]backend.App, 0, len(apps))
	names := make(map[string]bool)
	taken := map[int]string{WorkspacePort: "the workspace"}
	for i := range apps {
		taken[FirstInspectPort+i] = "an inspect port"
	}
	if a := spec.Agent; a != nil && a.Port != 0 {
		taken[a.Port] = "the agent"
	}
	for _, app := range apps {
		if app.Name == ContainerWS || app.Name == ContainerAgent || names[app.Name] || !ValidDNSLabel(app.Name) {
			return nil, fmt.Errorf("invalid or duplicate app name %q", app.Name)
		}
		names[app.Name] = true
		entry, err := contract.NormalizePath(app.Entry)
		if err != nil {
			return nil, fmt.Errorf("app %s: %w", app.Name, err)
		}
		app.Entry = entry
		own := make(map[string]bool)
		for _, pm := range app.Ports {
			if own[PortName(pm)] {
				continue
			}
			own[PortName(pm)] = true
			if who, ok := taken[pm.Port]; ok && who != "app "+app.Name {
				return nil, fmt.Errorf("app %s: port %d is taken by %s", app.Name, pm.Port, who)
			}
			taken[pm.Port] = "app " + app.Name
		}
		out = append(out, app)
	}
	return out, nil
}

// InspectPort is the inspect port of the watch app at index i.
func InspectPort(i int) int { return FirstInspectPort + i }

// Watch builds a watch session's pod named name (contract 11.4) with
// these departures, all documented in the package kubernetes doc:
//
//   - restartPolicy Always (19 item 16): a dead app container restarts;
//   - the workspace container is WorkspaceImage (telorunner's
//     workspace-server) with env exactly PORT and WORKSPACE_DIR, so no
//     workspace-app ConfigMap;
//   - app containers run WatchAppCommand: 10.1's entry wait, then the
//     kernel with its flags before the path (10.1 later).
func Watch(p Params, spec backend.Spec, name string) (*corev1.Pod, error) {
	apps, err := WatchApps(spec)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{ObjectMeta: objectMeta(p, name, spec.SessionID)}
	pod.Labels[LabelMode] = ModeWatch
	pod.Spec = basePodSpec(p, p.WatchTTLSeconds)
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.Volumes = []corev1.Volume{emptyDir("workspace")}
	for _, s := range scratch {
		pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDir(s.name))
	}

	ws := corev1.Container{
		Name:            ContainerWS,
		Image:           p.WorkspaceImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Env: envVars(map[string]string{
			"PORT": strconv.Itoa(WorkspacePort), "WORKSPACE_DIR": "/workspace",
		}),
		Ports:           []corev1.ContainerPort{{Name: PortName(contract.PortMapping{Port: WorkspacePort, Protocol: "tcp"}), ContainerPort: WorkspacePort, Protocol: corev1.ProtocolTCP}},
		Resources:       resources(p.AppLimits),
		VolumeMounts:    mounts(ContainerWS),
		SecurityContext: Hardened(),
	}
	pod.Spec.Containers = append(pod.Spec.Containers, ws)

	img := image(spec.Config, p.KernelImage)
	for i, app := range apps {
		tty := app.IO != contract.IOStreams
		infra := map[string]string{
			"HOME":              "/home/telo",
			"npm_config_cache":  "/home/telo/.npm",
			"TELO_ENTRY":        path.Join("/workspace", app.Entry),
			"TELO_INSPECT_ADDR": "0.0.0.0:" + strconv.Itoa(InspectPort(i)),
		}
		if tty {
			infra["CLICOLOR_FORCE"] = "1"
		}
		env := sessionEnv(spec.Env, "TELO_CACHE_DIR", "HOME", "npm_config_cache", "TELO_ENTRY", "TELO_INSPECT_ADDR", "CLICOLOR_FORCE")
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name:            AppContainerName(app.Name),
			Image:           img,
			ImagePullPolicy: PullPolicy(spec.Config.PullPolicy),
			WorkingDir:      "/work",
			Command:         WatchAppCommand,
			Env:             envVars(env, infra),
			Stdin:           true,
			TTY:             tty,
			Ports:           containerPorts(app.Ports),
			Resources:       resources(p.AppLimits),
			VolumeMounts:    mounts(AppContainerName(app.Name)),
			SecurityContext: Hardened(),
		})
	}

	if a := spec.Agent; a != nil {
		c := corev1.Container{
			Name:            ContainerAgent,
			Image:           a.Image,
			ImagePullPolicy: PullPolicy(a.PullPolicy),
			Env:             envVars(a.Env, map[string]string{"WORKSPACE_DIR": "/workspace", "CLICOLOR_FORCE": "1"}),
			Resources:       resources(p.AppLimits),
			VolumeMounts:    mounts(ContainerAgent),
			SecurityContext: relaxed(),
		}
		if a.Port != 0 {
			c.Ports = containerPorts([]contract.PortMapping{{Port: a.Port, Protocol: "tcp"}})
		}
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	return pod, nil
}

// mounts is the shared workspace plus owner's slice of the scratch
// volumes (subPath = owner).
func mounts(owner string) []corev1.VolumeMount {
	m := []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}}
	for _, s := range scratch {
		m = append(m, corev1.VolumeMount{Name: s.name, MountPath: s.path, SubPath: owner})
	}
	return m
}

// WatchAppCommand is every watch app container's command (contract 10.1,
// flags before the path): wait for the entry file, which appears when the
// runner seeds the workspace after the pod runs, then exec the kernel. A
// kernel started on a missing entry would report a failed first run.
// Paths come through the environment, so no path can break the quoting.
var WatchAppCommand = []string{"sh", "-c", `while [ ! -f "$TELO_ENTRY" ]; do sleep 0.2; done; exec telo run --watch --inspect "$TELO_INSPECT_ADDR" --no-open "$TELO_ENTRY"`}
