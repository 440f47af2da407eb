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
	"os"
	"os/exec"
	"path/filepath"
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
