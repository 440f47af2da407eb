package mountns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// run does the helper's work: mount, chdir, exec. It only returns on error
// (or after mounting when spec.Probe is set).
func run(spec Spec, argv []string) error {
	if !spec.Probe && (spec.Path == "" || len(argv) == 0) {
		return errNoProgram
	}
	// Open everything that a mount could cover before mounting anything.
	sources := make([]int, len(spec.Mounts))
	for i, m := range spec.Mounts {
		fd, err := unix.Open(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open volume %s: %w", m.Source, err)
		}
		sources[i] = fd
	}
	fallback, err := unix.Open(spec.FallbackDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open pod directory %s: %w", spec.FallbackDir, err)
	}
	// Directories a mount is about to cover stay reachable through a
	// descriptor that is kept open across exec, as /proc/self/fd/N: the
	// program itself, an interpreter opening a script by that path, and
	// PATH lookups of the program's children all use it.
	kept := map[string]string{}
	keep := func(dir string) (string, error) {
		if p, ok := kept[dir]; ok {
			return p, nil
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return "", err
		}
		kept[dir] = fmt.Sprintf("/proc/self/fd/%d", fd)
		return kept[dir], nil
	}
	program := spec.Path
	env := os.Environ()
	if !spec.Probe {
		if covered(spec.Path, spec.Mounts) {
			dir, err := keep(filepath.Dir(spec.Path))
			if err != nil {
				return fmt.Errorf("open program directory: %w", err)
			}
			program = dir + "/" + filepath.Base(spec.Path)
		}
		for i, kv := range env {
			path, ok := strings.CutPrefix(kv, "PATH=")
			if !ok {
				continue
			}
			entries := filepath.SplitList(path)
			for j, e := range entries {
				if filepath.IsAbs(e) && covered(e, spec.Mounts) {
					if fi, err := os.Stat(e); err == nil && fi.IsDir() {
						if entries[j], err = keep(e); err != nil {
							return fmt.Errorf("open PATH entry %s: %w", e, err)
						}
					}
				}
			}
			env[i] = "PATH=" + strings.Join(entries, string(filepath.ListSeparator))
		}
	}

	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	order := make([]int, len(spec.Mounts))
	for i := range order {
		order[i] = i
	}
	// Parents before children: /a is mounted before /a/b.
	slices.SortStableFunc(order, func(a, b int) int {
		return depth(spec.Mounts[a].Target) - depth(spec.Mounts[b].Target)
	})
	for _, i := range order {
		m := spec.Mounts[i]
		if err := bind(sources[i], m); err != nil {
			return err
		}
	}
	if spec.Probe {
		return nil
	}

	if fi, err := os.Stat(spec.Dir); spec.Dir != "" && err == nil && fi.IsDir() {
		if err := os.Chdir(spec.Dir); err != nil {
			return fmt.Errorf("change to working directory %s: %w", spec.Dir, err)
		}
	} else if err := unix.Fchdir(fallback); err != nil {
		return fmt.Errorf("change to pod directory: %w", err)
	}
	unix.CloseOnExec(spec.StatusFD)
	err = syscall.Exec(program, argv, env)
	return fmt.Errorf("exec %s: %w", spec.Path, err)
}

// bind mounts the opened source at m.Target, creating the target like a
// container runtime does: a directory for a directory, an empty file for a
// file.
func bind(source int, m Mount) error {
	var st unix.Stat_t
	if err := unix.Fstat(source, &st); err != nil {
		return fmt.Errorf("stat volume %s: %w", m.Source, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(m.Target), 0o755); err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
		f, err := os.OpenFile(m.Target, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
		if f != nil {
			_ = f.Close()
		}
	}
	src := fmt.Sprintf("/proc/self/fd/%d", source)
	if err := unix.Mount(src, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY)
		if err := unix.Mount("", m.Target, "", flags, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// covered reports whether a mount hides path.
func covered(path string, mounts []Mount) bool {
	for _, m := range mounts {
		t := filepath.Clean(m.Target)
		if path == t || strings.HasPrefix(path, strings.TrimSuffix(t, "/")+"/") {
			return true
		}
	}
	return false
}

func depth(p string) int {
	return strings.Count(filepath.Clean(p), "/")
}
