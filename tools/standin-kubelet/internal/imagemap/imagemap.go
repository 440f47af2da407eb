// Package imagemap maps container image references to local executables.
//
// A stand-in kubelet has no container runtime: a container "runs its image"
// by executing the host program the image is mapped to. Lookup tries the
// full image reference, then its repository (the reference without tag or
// digest), then the wildcard entry "*".
package imagemap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Wildcard is the entry used when no other entry matches.
const Wildcard = "*"

// Map is an image → executable table. The zero value maps nothing.
type Map map[string]string

// Parse reads "image=path,image=path,…". Paths that are not absolute are
// looked up in PATH; every executable must exist when Parse runs.
func Parse(s string) (Map, error) {
	m := Map{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		image, path, ok := strings.Cut(entry, "=")
		image, path = strings.TrimSpace(image), strings.TrimSpace(path)
		if !ok || image == "" || path == "" {
			return nil, fmt.Errorf("parse image map entry %q: want image=path", entry)
		}
		if _, dup := m[image]; dup {
			return nil, fmt.Errorf("parse image map: image %q mapped twice", image)
		}
		abs, err := executable(path)
		if err != nil {
			return nil, fmt.Errorf("parse image map entry %q: %w", entry, err)
		}
		m[image] = abs
	}
	return m, nil
}

func executable(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return exec.LookPath(path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", errors.New("not an executable file")
	}
	return path, nil
}

// Lookup returns the executable for image and whether one is mapped.
func (m Map) Lookup(image string) (string, bool) {
	if p, ok := m[image]; ok {
		return p, true
	}
	if p, ok := m[Repository(image)]; ok {
		return p, true
	}
	p, ok := m[Wildcard]
	return p, ok
}

// Repository strips the tag and digest from an image reference:
// "reg:5000/a/b:1.2@sha256:…" → "reg:5000/a/b".
func Repository(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	// A colon after the last slash starts the tag; one before it belongs
	// to a registry host:port.
	if i := strings.LastIndexByte(image, ':'); i > strings.LastIndexByte(image, '/') {
		image = image[:i]
	}
	return image
}

// Stage puts a copy of every program of m into dir and returns the map
// with the copies, so that any user can run them: a program the tests
// build into a 0700 temporary directory is out of reach of a container
// that runs as uid 1000. dir is emptied first; each program gets its own
// directory dir/<n> (n counts the distinct programs in path order), mode
// 0755, holding it under its own base name (a shell finds the telo image's
// program as "telo" through PATH). A program that is already readable and
// executable by everyone is hard-linked when dir is on its file system;
// anything else is copied with mode 0755. Symbolic links are resolved
// first (/bin/sh → the shell itself, under the name sh).
func (m Map) Stage(dir string) (Map, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("stage programs: %w", err)
	}
	if err := mkdir(dir); err != nil {
		return nil, fmt.Errorf("stage programs: %w", err)
	}
	programs := map[string]string{}
	for _, p := range m {
		programs[p] = ""
	}
	paths := make([]string, 0, len(programs))
	for p := range programs {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for n, p := range paths {
		d := filepath.Join(dir, strconv.Itoa(n))
		if err := mkdir(d); err != nil {
			return nil, fmt.Errorf("stage %s: %w", p, err)
		}
		staged := filepath.Join(d, filepath.Base(p))
		if err := stage(p, staged); err != nil {
			return nil, fmt.Errorf("stage %s: %w", p, err)
		}
		programs[p] = staged
	}
	out := make(Map, len(m))
	for image, p := range m {
		out[image] = programs[p]
	}
	return out, nil
}

// mkdir creates dir with mode 0755 whatever the umask.
func mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// stage hard-links or copies program to dst.
func stage(program, dst string) error {
	src, err := filepath.EvalSymlinks(program)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	// A link shares the file's mode: only one that everyone may read and
	// run already is linked rather than changed.
	if fi.Mode().Perm()&0o555 == 0o555 && os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, 0o755)
}
