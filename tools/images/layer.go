package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// entry is one file or directory of a layer.
type entry struct {
	name     string // relative, no leading slash; directories end in "/"
	mode     int64
	uid, gid int
	data     []byte
}

// tarLayer writes entries sorted by name, every one with time t, numeric
// owners and no user or group names, so the bytes (and the digest) depend
// on the contents alone.
func tarLayer(t time.Time, entries []entry) (v1.Layer, error) {
	entries = slices.Clone(entries)
	slices.SortFunc(entries, func(a, b entry) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, e := range entries {
		if i > 0 && entries[i-1].name == e.name {
			return nil, fmt.Errorf("layer: %s twice", e.name)
		}
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: t, Format: tar.FormatPAX}
		if e.name[len(e.name)-1] == '/' {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		// PAX without access/change times: only what is set above.
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// dirs adds the parent directories of entries (root-owned, 0755) that are
// not listed.
func dirs(entries []entry) []entry {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.name] = true
	}
	out := slices.Clone(entries)
	for _, e := range entries {
		for d := path.Dir(path.Clean(e.name)); d != "." && d != "/"; d = path.Dir(d) {
			if !have[d+"/"] {
				have[d+"/"] = true
				out = append(out, entry{name: d + "/", mode: 0o755})
			}
		}
	}
	return out
}

// CABundle is the PEM of the unconstrained roots of
// golang.org/x/crypto/x509roots/fallback (Mozilla's NSS store, pinned by
// go.sum). Roots that carry a constraint (a distrust-after date) are left
// out: a PEM file cannot state the constraint, and trusting them fully
// would trust more than NSS does.
func CABundle() []byte {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return b.Bytes()
}

// baseLayer is the filesystem every image shares.
func baseLayer(t time.Time) (v1.Layer, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\ntelorunner:x:%d:%d:telorunner:%s:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n", UID, GID, Home)
	group := fmt.Sprintf("root:x:0:\ntelorunner:x:%d:\nnobody:x:65534:\n", GID)
	return tarLayer(t, dirs([]entry{
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: CAFile[1:], mode: 0o644, data: CABundle()},
		{name: "tmp/", mode: 0o1777},
		{name: Home[1:] + "/", mode: 0o700, uid: UID, gid: GID},
	}))
}

// binaryLayer holds the binary at /usr/local/bin/<name>.
func binaryLayer(t time.Time, name, bin string) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return tarLayer(t, dirs([]entry{{name: BinDir[1:] + "/" + name, mode: 0o755, data: data}}))
}
