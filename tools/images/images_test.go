//go:build linux

package main

import (
	"archive/tar"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

const root = "../.."

// build runs Build as `make images` does, into a fresh directory.
func build(t *testing.T, out string) []Image {
	t.Helper()
	imgs, err := Build(t.Context(), Options{
		Root: root, Out: out, Revision: "0123456789abcdef0123456789abcdef01234567",
		Created: time.Unix(1767225600, 0), Arch: runtime.GOARCH,
	})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return imgs
}

// files reads every entry of the image's layers (later layers win).
func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = h
		}
		rc.Close()
	}
	return out
}

// extract copies path p (no leading slash) out of the image's layers.
func extract(t *testing.T, img v1.Image, p, to string) {
	t.Helper()
	layers, _ := img.Layers()
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == p {
				f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(f, tr); err != nil {
					t.Fatal(err)
				}
				f.Close()
				rc.Close()
				return
			}
		}
		rc.Close()
	}
	t.Fatalf("image has no %s", p)
}

func openImage(t *testing.T, im Image) (v1.Image, v1.Descriptor) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(im.Dir)
	if err != nil {
		t.Fatalf("open layout %s: %v", im.Dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("%s: %d manifests, want 1", im.Dir, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, m.Manifests[0]
}

// TestImages builds every image twice and checks each one: the same
// digests both times, named as the chart's defaults, a non-root numeric
// user, the binary as entrypoint, the OCI labels, CA roots, no shell, and
// the binary taken from the layer runs and reports the stamped version.
func TestImages(t *testing.T) {
	first := build(t, filepath.Join(t.TempDir(), "oci"))
	second := build(t, filepath.Join(t.TempDir(), "oci"))

	repo, tag, err := ChartDefaults(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range Binaries {
		names = append(names, b.Name)
	}
	var got []string
	for _, im := range first {
		got = append(got, im.Name)
	}
	if !slices.Equal(got, names) {
		t.Fatalf("built %v, want %v", got, names)
	}
	if len(second) != len(first) {
		t.Fatalf("second build: %d images, want %d", len(second), len(first))
	}
	list, err := os.ReadFile(filepath.Join(filepath.Dir(first[0].Dir), "images.txt"))
	if err != nil {
		t.Fatal(err)
	}

	for i, im := range first {
		t.Run(im.Name, func(t *testing.T) {
			if second[i].Digest != im.Digest {
				t.Errorf("digest %s, then %s: not reproducible", im.Digest, second[i].Digest)
			}
			wantRef := repo + "/" + im.Name + ":" + tag
			img, desc := openImage(t, im)
			if ref := desc.Annotations[RefName]; ref != wantRef || im.Ref != wantRef {
				t.Errorf("reference %q (%q), want the chart's default %q", ref, im.Ref, wantRef)
			}
			if d, _ := img.Digest(); d != im.Digest || desc.Digest != im.Digest {
				t.Errorf("layout digest %s / %s, want %s", d, desc.Digest, im.Digest)
			}
			if !strings.Contains(string(list), wantRef+"@"+im.Digest.String()+"\n") {
				t.Errorf("images.txt lacks %s@%s:\n%s", wantRef, im.Digest, list)
			}
			mt, _ := img.MediaType()
			if mt != "application/vnd.oci.image.manifest.v1+json" {
				t.Errorf("media type %s, want an OCI manifest", mt)
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if c.User != "1000:1000" {
				t.Errorf("user %q, want 1000:1000 (numeric, not root)", c.User)
			}
			entry := "/usr/local/bin/" + im.Name
			if !slices.Equal(c.Entrypoint, []string{entry}) || len(c.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", c.Entrypoint, c.Cmd, entry)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
			}
			if !cf.Created.Time.Equal(time.Unix(1767225600, 0)) {
				t.Errorf("created %v, want the fixed time", cf.Created)
			}
			for k, v := range map[string]string{
				"org.opencontainers.image.source":   "https://github.com/telorunner/telorunner",
				"org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
				"org.opencontainers.image.version":  tag,
			} {
				if c.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
				}
			}

			fs := files(t, img)
			var paths []string
			for p, h := range fs {
				paths = append(paths, p)
				if !h.ModTime.Equal(time.Unix(1767225600, 0)) {
					t.Errorf("%s: mtime %v, want the fixed time", p, h.ModTime)
				}
				if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink {
					t.Errorf("%s: link in the image", p)
				}
			}
			slices.Sort(paths)
			want := []string{"etc/", "etc/group", "etc/passwd", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt",
				"home/", "home/telorunner/", "tmp/", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/" + im.Name}
			if !slices.Equal(paths, want) {
				t.Errorf("files %q, want exactly %q (no shell, nothing else)", paths, want)
			}
			if h := fs["home/telorunner/"]; h == nil || h.Uid != 1000 || h.Gid != 1000 {
				t.Errorf("home not owned by 1000:1000: %+v", h)
			}
			if h := fs["usr/local/bin/"+im.Name]; h == nil || h.Mode&0o111 == 0 || h.Uid != 0 {
				t.Errorf("binary not a root-owned executable: %+v", h)
			}

			dir := t.TempDir()
			extract(t, img, "etc/passwd", filepath.Join(dir, "passwd"))
			passwd, _ := os.ReadFile(filepath.Join(dir, "passwd"))
			if !strings.Contains(string(passwd), "telorunner:x:1000:1000:") {
				t.Errorf("/etc/passwd has no entry for uid 1000:\n%s", passwd)
			}
			extract(t, img, "etc/ssl/certs/ca-certificates.crt", filepath.Join(dir, "ca.crt"))
			pemData, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
			n := 0
			for rest := pemData; ; {
				var b *pem.Block
				b, rest = pem.Decode(rest)
				if b == nil {
					break
				}
				if _, err := x509.ParseCertificate(b.Bytes); err != nil {
					t.Fatalf("CA bundle: %v", err)
				}
				n++
			}
			if n < 100 {
				t.Errorf("CA bundle holds %d certificates, want the NSS roots (over 100)", n)
			}

			bin := filepath.Join(dir, im.Name)
			extract(t, img, "usr/local/bin/"+im.Name, bin)
			out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput()
			if err != nil {
				t.Fatalf("%s version: %v\n%s", im.Name, err, out)
			}
			wantOut := im.Name + " " + tag + " (0123456789abcdef0123456789abcdef01234567, go"
			if !strings.HasPrefix(string(out), wantOut) {
				t.Errorf("%s version = %q, want prefix %q", im.Name, out, wantOut)
			}
			// Static: no program interpreter to load.
			if file, err := os.ReadFile(bin); err == nil && strings.Contains(string(file[:min(len(file), 4096)]), "ld-linux") {
				t.Errorf("%s is dynamically linked", im.Name)
			}
		})
	}
}

// TestPush pushes built images to a registry (go-containerregistry's
// registry server on loopback) and pulls them back by tag: the same
// digests arrive under <registry>/<name>:<tag>.
func TestPush(t *testing.T) {
	out := filepath.Join(t.TempDir(), "oci")
	imgs, err := Build(t.Context(), Options{Root: root, Out: out, Revision: "r", Arch: runtime.GOARCH, Only: []string{"supervisor", "workspace-server"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 2 {
		t.Fatalf("built %d images, want 2", len(imgs))
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://") + "/team/telo"

	pushed, err := Push(t.Context(), out, reg, true)
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	if len(pushed) != 2 {
		t.Fatalf("pushed %v, want 2 images", pushed)
	}
	_, tag, _ := ChartDefaults(root)
	for _, im := range imgs {
		ref, err := name.NewTag(reg+"/"+im.Name+":"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if d, _ := got.Digest(); d != im.Digest {
			t.Errorf("%s digest %s, want %s", ref, d, im.Digest)
		}
		if !slices.Contains(pushed, ref.String()+"@"+im.Digest.String()) {
			t.Errorf("Push reported %v, want %s@%s among them", pushed, ref, im.Digest)
		}
	}

	if _, err := Push(t.Context(), t.TempDir(), reg, true); err == nil {
		t.Error("Push of an empty directory succeeded, want an error")
	}
}
