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

// run does the helper's work: mount, chdir, switch identity, exec. It only
// returns on error (or after mounting when spec.Probe is set).
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
	// The program's directory and every PATH entry are opened now too, as
	// root: one that a mount is about to cover, or whose path the
	// program's user cannot search, is then reached through a descriptor
	// kept open across exec, as /proc/self/fd/N — by the exec below, by an
	// interpreter opening a script by that path, and by PATH lookups of
	// the program's children.
	held := map[string]*heldDir{}
	hold := func(dir string) (*heldDir, error) {
		if h, ok := held[dir]; ok {
			return h, nil
		}
		h := &heldDir{path: dir, covered: covered(dir, spec.Mounts)}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if h.covered {
				return nil, err
			}
			// Not there or not a directory: the path is used as it is.
			h.fd = -1
		} else {
			h.fd = fd
		}
		held[dir] = h
		return h, nil
	}
	env := os.Environ()
	var programDir *heldDir
	pathAt := -1
	var pathEntries []*heldDir
	var pathList []string
	if !spec.Probe {
		if programDir, err = hold(filepath.Dir(spec.Path)); err != nil {
			return fmt.Errorf("open program directory: %w", err)
		}
		for i, kv := range env {
			path, ok := strings.CutPrefix(kv, "PATH=")
			if !ok {
				continue
			}
			pathAt, pathList = i, filepath.SplitList(path)
			pathEntries = make([]*heldDir, len(pathList))
			for j, e := range pathList {
				if !filepath.IsAbs(e) {
					continue
				}
				if fi, err := os.Stat(e); err != nil || !fi.IsDir() {
					continue
				}
				if pathEntries[j], err = hold(e); err != nil {
					return fmt.Errorf("open PATH entry %s: %w", e, err)
				}
			}
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

	// The working directory is entered as root, like runc does: a
	// directory only root can enter is still the program's working
	// directory.
	if fi, err := os.Stat(spec.Dir); spec.Dir != "" && err == nil && fi.IsDir() {
		if err := os.Chdir(spec.Dir); err != nil {
			return fmt.Errorf("change to working directory %s: %w", spec.Dir, err)
		}
	} else if err := unix.Fchdir(fallback); err != nil {
		return fmt.Errorf("change to pod directory: %w", err)
	}
	nonRoot := false
	if id := spec.Identity; id != nil {
		if err := id.Apply(); err != nil {
			return err
		}
		nonRoot = !id.Root()
	}

	program := spec.Path
	if p, err := programDir.reach(nonRoot); err != nil {
		return fmt.Errorf("keep program directory: %w", err)
	} else if p != programDir.path {
		program = p + "/" + filepath.Base(spec.Path)
	}
	if pathAt >= 0 {
		for j, h := range pathEntries {
			if h == nil {
				continue
			}
			if pathList[j], err = h.reach(nonRoot); err != nil {
				return fmt.Errorf("keep PATH entry %s: %w", h.path, err)
			}
		}
		env[pathAt] = "PATH=" + strings.Join(pathList, string(filepath.ListSeparator))
	}
	unix.CloseOnExec(spec.StatusFD)
	err = syscall.Exec(program, argv, env)
	return fmt.Errorf("exec %s: %w", spec.Path, err)
}

// heldDir is a directory the program may need by path, opened (O_PATH,
// close-on-exec) before mounting; fd is -1 when it could not be opened.
type heldDir struct {
	path    string
	fd      int
	covered bool // a mount hides path
	kept    string
}

// reach returns how the program reaches the directory: its path, or
// /proc/self/fd/N when a mount covers the path or (nonRoot: the process
// already switched to a user other than root) that user cannot search it.
// A kept descriptor stays open across exec.
func (h *heldDir) reach(nonRoot bool) (string, error) {
	if h.kept != "" {
		return h.kept, nil
	}
	if h.fd < 0 {
		return h.path, nil
	}
	if !h.covered && (!nonRoot || unix.Access(h.path, unix.X_OK) == nil) {
		return h.path, nil
	}
	if _, err := unix.FcntlInt(uintptr(h.fd), unix.F_SETFD, 0); err != nil {
		return "", err
	}
	h.kept = fmt.Sprintf("/proc/self/fd/%d", h.fd)
	return h.kept, nil
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
