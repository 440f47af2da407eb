package sandbox

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/expand"
)

// EnvPodIP is set in every container to the pod's IP, in addition to the
// spec's env: programs must bind it rather than 0.0.0.0.
const EnvPodIP = "POD_IP"

// EnvVolumePrefix names, in env volume mode, the host directory of each
// volume a container mounts: TELO_VOLUME_<NAME>, NAME upper-cased with
// every other character than a letter or digit turned into "_".
const EnvVolumePrefix = "TELO_VOLUME_"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// envList is an ordered environment where a later value replaces an
// earlier one in place.
type envList struct {
	names []string
	vals  map[string]string
}

func (e *envList) set(name, value string) {
	if e.vals == nil {
		e.vals = map[string]string{}
	}
	if _, ok := e.vals[name]; !ok {
		e.names = append(e.names, name)
	}
	e.vals[name] = value
}

func (e *envList) environ() []string {
	out := make([]string, 0, len(e.names))
	for _, n := range e.names {
		out = append(out, n+"="+e.vals[n])
	}
	return out
}

// containerEnv builds c's environment the way a kubelet does, on top of a
// small base (PATH, HOSTNAME, HOME=home, TERM for a tty) and POD_IP: envFrom
// first, then env in order, each value expanded against what was defined
// before it. volumes (env volume mode only) adds TELO_VOLUME_* entries.
// PATH is the host's with the directory of the image's program first, so
// that a script can run the program by its file name.
func (s *Sandbox) containerEnv(ctx context.Context, c *v1.Container, program, home string, volumes map[string]string) (*envList, error) {
	e := &envList{}
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	if dir := filepath.Dir(program); !slices.Contains(filepath.SplitList(path), dir) {
		path = dir + string(filepath.ListSeparator) + path
	}
	e.set("PATH", path)
	e.set("HOSTNAME", s.pod.Name)
	e.set("HOME", home)
	if c.TTY {
		e.set("TERM", "xterm")
	}
	e.set(EnvPodIP, s.cfg.IP)
	for _, vm := range c.VolumeMounts {
		if dir, ok := volumes[vm.Name]; ok {
			e.set(EnvVolumePrefix+envName(vm.Name), dir)
		}
	}

	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := s.cfg.Objects.ConfigMap(ctx, s.pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("get configmap %s: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			sec, err := s.cfg.Objects.Secret(ctx, s.pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && isTrue(from.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("get secret %s: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for k, v := range sec.Data {
				data[k] = string(v)
			}
		}
		for k, v := range data {
			e.set(from.Prefix+k, v)
		}
	}

	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			e.set(ev.Name, expand.String(ev.Value, expand.Map(e.vals)))
			continue
		}
		v, ok, err := s.envSource(ctx, c, ev.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", ev.Name, err)
		}
		if ok {
			e.set(ev.Name, v)
		}
	}
	return e, nil
}

// envSource resolves a valueFrom; ok is false for a missing optional key.
func (s *Sandbox) envSource(ctx context.Context, c *v1.Container, src *v1.EnvVarSource) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := s.fieldRef(src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceRef(c, src.ResourceFieldRef)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := s.cfg.Objects.ConfigMap(ctx, s.pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("get configmap %s: %w", ref.Name, err)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, true, nil
		}
		if isTrue(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("configmap %s has no key %q", ref.Name, ref.Key)
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		sec, err := s.cfg.Objects.Secret(ctx, s.pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("get secret %s: %w", ref.Name, err)
		}
		if v, ok := sec.Data[ref.Key]; ok {
			return string(v), true, nil
		}
		if isTrue(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

var labelRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['(.+)'\]$`)

// fieldRef resolves the downward API field paths a kubelet supports.
func (s *Sandbox) fieldRef(path string) (string, error) {
	p := s.pod
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "metadata.uid":
		return string(p.UID), nil
	case "spec.nodeName":
		return s.cfg.NodeName, nil
	case "spec.serviceAccountName":
		return p.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return s.cfg.IP, nil
	case "status.hostIP", "status.hostIPs":
		return s.cfg.HostIP, nil
	}
	if m := labelRef.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return p.Labels[m[2]], nil
		}
		return p.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

// nodeAllocatable is what a container without a limit may use.
var nodeAllocatable = v1.ResourceList{
	v1.ResourceCPU:              resource.MustParse("8"),
	v1.ResourceMemory:           resource.MustParse("16Gi"),
	v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
}

// resourceRef resolves limits.* and requests.* like the kubelet: a missing
// limit is the node's allocatable, the value is rounded up to the divisor.
func resourceRef(c *v1.Container, ref *v1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	rn := v1.ResourceName(name)
	var q resource.Quantity
	var found bool
	if kind == "limits" {
		q, found = c.Resources.Limits[rn]
	} else {
		q, found = c.Resources.Requests[rn]
	}
	if !found && kind == "limits" {
		q, found = nodeAllocatable[rn]
	}
	if !found {
		q = resource.Quantity{}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	v := math.Ceil(q.AsApproximateFloat64() / div.AsApproximateFloat64())
	return fmt.Sprintf("%d", int64(v)), nil
}

func envName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, s)
}

func isTrue(b *bool) bool { return b != nil && *b }

// command returns the program to run for c and its argv: command then
// args, each expanded against env. Which program runs:
//   - no command: the image's program, as its entrypoint (argv[0] is its path);
//   - command[0] names a program on the container's PATH (which starts
//     with the image program's directory) or an existing absolute path:
//     that program, so that "sh -c '… exec telo …'" runs a shell;
//   - otherwise the image's program, with command[0] as argv[0].
func command(c *v1.Container, program string, env map[string]string) (string, []string) {
	argv := make([]string, 0, len(c.Command)+len(c.Args)+1)
	if len(c.Command) == 0 {
		argv = append(argv, program)
	}
	for _, a := range c.Command {
		argv = append(argv, expand.String(a, expand.Map(env)))
	}
	for _, a := range c.Args {
		argv = append(argv, expand.String(a, expand.Map(env)))
	}
	if len(c.Command) == 0 {
		return program, argv
	}
	if p, ok := lookPath(argv[0], env["PATH"]); ok {
		return p, argv
	}
	return program, argv
}

// lookPath finds an executable file like a shell does, in the host's
// file system.
func lookPath(name, path string) (string, bool) {
	if name == "" {
		return "", false
	}
	if strings.Contains(name, "/") {
		return name, filepath.IsAbs(name) && isExecutable(name)
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, true
		}
	}
	return "", false
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
