package imagebuild

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TopLayer lists the top layer of img: "path" for files (with
// "=contents"), "path/" for directories, "path -> target" for links.
func topLayer(t *testing.T, img v1.Image) []string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := ls[len(ls)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out = append(out, h.Name)
		case tar.TypeSymlink:
			out = append(out, h.Name+" -> "+h.Linkname)
		default:
			b, _ := io.ReadAll(tr)
			out = append(out, h.Name+"="+string(b))
		}
		if h.Uid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: uid %d mtime %v", h.Name, h.Uid, h.ModTime)
		}
	}
	return out
}

func TestLayer(t *testing.T) {
	srv := authRegistry(t, false)
	host := strings.TrimPrefix(srv.URL, "http://")
	keys, _ := ParseDockerConfig(dockerConfig(host, user, pass))
	base, err := random.Image(128, 2)
	if err != nil {
		t.Fatal(err)
	}
	baseRef := host + "/telorun/node:1.0.0"
	ref, _ := name.ParseReference(baseRef, name.Insecure)
	if err := remote.Write(ref, base, remote.WithAuthFromKeychain(keys)); err != nil {
		t.Fatal(err)
	}

	root := t.TempDir()
	// /app as a ConfigMap volume lays it out: files behind ..data.
	data := filepath.Join(root, "app", "..2026_12_02")
	must(t, os.MkdirAll(filepath.Join(data, "lib"), 0o755))
	must(t, os.WriteFile(filepath.Join(data, "telo.yaml"), []byte("kind: Telo.Application\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(data, "lib", "x.yaml"), []byte("x"), 0o644))
	must(t, os.Symlink("..2026_12_02", filepath.Join(root, "app", "..data")))
	must(t, os.Symlink("..data/telo.yaml", filepath.Join(root, "app", "telo.yaml")))
	must(t, os.Symlink("..data/lib", filepath.Join(root, "app", "lib")))
	// The cache keeps its own links (npm's .bin).
	must(t, os.MkdirAll(filepath.Join(root, "telo-cache", "pkg", "bin"), 0o700))
	must(t, os.WriteFile(filepath.Join(root, "telo-cache", "pkg", "bin", "run.js"), []byte("#!/usr/bin/env node\n"), 0o700))
	must(t, os.Symlink("pkg/bin/run.js", filepath.Join(root, "telo-cache", "run")))

	dest := host + "/telo/apps:abc"
	opts := LayerOptions{Base: baseRef, Dest: dest, Dirs: []string{"/app", "/telo-cache"}, Root: root, Follow: []string{"/app"}, Insecure: true, Keys: keys}
	d1, err := Layer(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	dref, _ := name.ParseReference(dest, name.Insecure)
	img, err := remote.Image(dref, remote.WithAuthFromKeychain(keys))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got != d1 {
		t.Fatalf("pushed digest %s, Layer returned %s", got, d1)
	}
	ls, _ := img.Layers()
	bl, _ := base.Layers()
	if len(ls) != len(bl)+1 {
		t.Fatalf("%d layers, want the base's %d + 1", len(ls), len(bl))
	}
	for i := range bl {
		a, _ := bl[i].Digest()
		b, _ := ls[i].Digest()
		if a != b {
			t.Fatalf("base layer %d changed", i)
		}
	}
	want := []string{"app/", "app/lib/", "app/lib/x.yaml=x", "app/telo.yaml=kind: Telo.Application\n",
		"telo-cache/", "telo-cache/pkg/", "telo-cache/pkg/bin/", "telo-cache/pkg/bin/run.js=#!/usr/bin/env node\n", "telo-cache/run -> pkg/bin/run.js"}
	if got := topLayer(t, img); !slices.Equal(got, want) {
		t.Fatalf("top layer\n%q\nwant\n%q", got, want)
	}
	cfg, _ := img.ConfigFile()
	if !slices.Contains(cfg.Config.Env, "TELO_CACHE_DIR=/telo-cache") {
		t.Errorf("config env %v", cfg.Config.Env)
	}
	// Reproducible: the same inputs give the same image.
	d2, err := Layer(context.Background(), opts)
	if err != nil || d2 != d1 {
		t.Fatalf("second build %s, %v; want %s", d2, err, d1)
	}
	// Wrong credentials fail the push.
	bad, _ := ParseDockerConfig(dockerConfig(host, user, "nope"))
	opts.Keys = bad
	if _, err := Layer(context.Background(), opts); err == nil {
		t.Fatal("Layer with wrong credentials succeeded")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
