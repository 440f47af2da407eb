package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/expand"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/identity"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
)

// volume is a pod volume as a host path.
type volume struct {
	path     string
	readOnly bool // the volume type is read-only (configMap, secret)
}

// prepareVolumes materialises the pod's volumes under the pod directory:
// emptyDirs become directories, configMaps and secrets become files (their
// content as of now; later updates are not followed), hostPaths are used
// as they are. Unsupported types become empty directories with a warning.
//
// With ApplyIdentity and a pod fsGroup, every volume but hostPath is then
// given to the fsGroup as the kubelet's SetVolumeOwnership does: group
// fsGroup, ug+rw (ug+r for the read-only configMap, secret and projected
// volumes), directories also ug+x and setgid so that what containers
// create in them belongs to the fsGroup too. An emptyDir is thus
// root:<fsGroup> 2777, a configMap's files 0644 and directories 2755.
func (s *Sandbox) prepareVolumes(ctx context.Context) (map[string]volume, error) {
	vols := map[string]volume{}
	fsGroup, hasFSGroup := identity.FSGroup(s.pod)
	hasFSGroup = hasFSGroup && s.cfg.ApplyIdentity
	if err := mkdirMode(filepath.Join(s.cfg.Dir, "volumes"), 0o755); err != nil {
		return nil, fmt.Errorf("create volumes directory: %w", err)
	}
	own := func(v volume, name string) error {
		if !hasFSGroup {
			return nil
		}
		if err := setVolumeOwnership(v.path, fsGroup, v.readOnly); err != nil {
			return fmt.Errorf("volume %s: give it to fsGroup %d: %w", name, fsGroup, err)
		}
		return nil
	}
	for _, v := range s.pod.Spec.Volumes {
		dir := filepath.Join(s.cfg.Dir, "volumes", v.Name)
		switch {
		case v.HostPath != nil:
			if t := v.HostPath.Type; t != nil && *t == v1.HostPathDirectoryOrCreate {
				if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
					return nil, fmt.Errorf("create hostPath volume %s: %w", v.Name, err)
				}
			}
			vols[v.Name] = volume{path: v.HostPath.Path}
			continue
		case v.EmptyDir != nil:
		case v.ConfigMap != nil:
			files, err := s.configMapFiles(ctx, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
			if err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			if err := writeFiles(dir, files, mode(v.ConfigMap.DefaultMode)); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			vols[v.Name] = volume{path: dir, readOnly: true}
			if err := own(vols[v.Name], v.Name); err != nil {
				return nil, err
			}
			continue
		case v.Secret != nil:
			files, err := s.secretFiles(ctx, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
			if err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			if err := writeFiles(dir, files, mode(v.Secret.DefaultMode)); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			vols[v.Name] = volume{path: dir, readOnly: true}
			if err := own(vols[v.Name], v.Name); err != nil {
				return nil, err
			}
			continue
		case v.Projected != nil:
			files := map[string][]byte{}
			for _, src := range v.Projected.Sources {
				var got map[string][]byte
				var err error
				switch {
				case src.ConfigMap != nil:
					got, err = s.configMapFiles(ctx, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
				case src.Secret != nil:
					got, err = s.secretFiles(ctx, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
				default:
					s.log.Warn("projected volume source not supported, left out", "volume", v.Name)
				}
				if err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
				for k, b := range got {
					files[k] = b
				}
			}
			if err := writeFiles(dir, files, mode(v.Projected.DefaultMode)); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			vols[v.Name] = volume{path: dir, readOnly: true}
			if err := own(vols[v.Name], v.Name); err != nil {
				return nil, err
			}
			continue
		default:
			s.log.Warn("volume type not supported, using an empty directory", "volume", v.Name)
		}
		// Like the kubelet's emptyDir: 0777 whatever the umask, writable
		// by every user of the pod.
		if err := mkdirMode(dir, 0o777); err != nil {
			return nil, fmt.Errorf("create volume %s: %w", v.Name, err)
		}
		vols[v.Name] = volume{path: dir}
		if err := own(vols[v.Name], v.Name); err != nil {
			return nil, err
		}
	}
	return vols, nil
}

// mkdirMode creates dir (and its parents) and gives it mode exactly,
// whatever the umask.
func mkdirMode(dir string, mode fs.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

// The kubelet's masks for a volume given to an fsGroup.
const (
	rwMask   fs.FileMode = 0o660
	roMask   fs.FileMode = 0o440
	execMask fs.FileMode = 0o110
)

// setVolumeOwnership gives everything under dir to group gid like the
// kubelet's SetVolumeOwnership: owner unchanged, group gid, mode plus
// ug+rw (readOnly: ug+r), directories also ug+x and setgid. Symbolic
// links are re-grouped but not chmod'ed.
func setVolumeOwnership(dir string, gid uint32, readOnly bool) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, -1, int(gid)); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mask := rwMask
		if readOnly {
			mask = roMask
		}
		if d.IsDir() {
			mask |= os.ModeSetgid | execMask
		}
		return os.Chmod(path, info.Mode()&(fs.ModePerm|os.ModeSetgid|os.ModeSetuid|os.ModeSticky)|mask)
	})
}

func (s *Sandbox) configMapFiles(ctx context.Context, name string, items []v1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := s.cfg.Objects.ConfigMap(ctx, s.pod.Namespace, name)
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get configmap %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return pick(data, items, optional, "configmap "+name)
}

func (s *Sandbox) secretFiles(ctx context.Context, name string, items []v1.KeyToPath, optional *bool) (map[string][]byte, error) {
	sec, err := s.cfg.Objects.Secret(ctx, s.pod.Namespace, name)
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get secret %s: %w", name, err)
	}
	return pick(sec.Data, items, optional, "secret "+name)
}

// pick maps keys to relative file paths: every key, or the listed items.
func pick(data map[string][]byte, items []v1.KeyToPath, optional *bool, what string) (map[string][]byte, error) {
	if len(items) == 0 {
		return data, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			if optional != nil && *optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = b
	}
	return out, nil
}

// writeFiles writes a configMap, secret or projected volume: directories
// 0755 and files perm (the volume's defaultMode, 0644 by default), both
// whatever the umask, as the kubelet's atomic writer does.
func writeFiles(dir string, files map[string][]byte, perm fs.FileMode) error {
	if err := mkdirMode(dir, 0o755); err != nil {
		return err
	}
	for rel, b := range files {
		p := filepath.Join(dir, filepath.Clean("/"+rel))
		if p == dir {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		for d := filepath.Dir(p); strings.HasPrefix(d, dir+string(filepath.Separator)); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(p, b, perm); err != nil {
			return err
		}
		if err := os.Chmod(p, perm); err != nil {
			return err
		}
	}
	return nil
}

func mode(m *int32) fs.FileMode {
	if m == nil {
		return 0o644
	}
	return fs.FileMode(*m) & fs.ModePerm
}

// mounts returns c's volume mounts as bind mounts, creating subPath
// directories inside their volumes. env expands subPathExpr.
func mounts(c *v1.Container, vols map[string]volume, env map[string]string) ([]mountns.Mount, error) {
	var out []mountns.Mount
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s: no volume %q", vm.MountPath, vm.Name)
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expand.String(vm.SubPathExpr, expand.Map(env))
		}
		src := v.path
		if sub != "" {
			if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
				return nil, fmt.Errorf("volume mount %s: subPath %q leaves the volume", vm.MountPath, sub)
			}
			src = filepath.Join(v.path, sub)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := makeSubPath(v.path, sub); err != nil {
					return nil, fmt.Errorf("volume mount %s: create subPath: %w", vm.MountPath, err)
				}
			}
		}
		out = append(out, mountns.Mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly || v.readOnly})
	}
	return out, nil
}

// makeSubPath creates the missing directories of sub inside the volume
// directory root like the kubelet does, so that the container's user can
// use them as it can use the volume: each gets the mode of root (setgid
// and sticky bits included) whatever the umask, and, under a setgid root
// (an fsGroup volume), the kernel gives it root's group.
func makeSubPath(root, sub string) error {
	fi, err := os.Stat(root)
	if err != nil {
		return err
	}
	mode := fi.Mode() & (fs.ModePerm | os.ModeSetgid | os.ModeSticky)
	cur := root
	for part := range strings.SplitSeq(filepath.Clean(sub), string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, mode.Perm()); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return err
		}
		if err := os.Chmod(cur, mode); err != nil {
			return err
		}
	}
	return nil
}
