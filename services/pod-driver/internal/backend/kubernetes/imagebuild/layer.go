package imagebuild

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// LayerOptions is one run of the layer builder (telo-layer, the push
// container of a layer build Job).
type LayerOptions struct {
	Base, Dest string // image refs
	// Dirs are the directories that become the layer, by their path in
	// the image ("/app", "/telo-cache"), read from the same path here
	// unless Root prefixes it.
	Dirs []string
	Root string // "" in the Job; tests point it at a directory
	// Follow lists the Dirs whose symbolic links are followed (a
	// ConfigMap volume's ..data links); elsewhere links are kept.
	Follow   []string
	Insecure bool           // plain HTTP registries
	Keys     authn.Keychain // nil: anonymous
	Platform *v1.Platform   // nil: linux/<GOARCH>
	TempDir  string         // "" = os.TempDir()
}

// Layer appends Dirs as one layer onto Base and pushes the result to
// Dest; it returns the pushed image's digest. The layer is reproducible:
// sorted entries, mtime 0, uid/gid 0, directories 0755, files 0644 (0755
// when executable): the run pod's user (uid 1000) reads everything, and
// the same install gives the same digest.
func Layer(ctx context.Context, o LayerOptions) (v1.Hash, error) {
	var opts []name.Option
	if o.Insecure {
		opts = append(opts, name.Insecure)
	}
	base, err := name.ParseReference(o.Base, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("base image %q: %w", o.Base, err)
	}
	dest, err := name.ParseReference(o.Dest, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("destination %q: %w", o.Dest, err)
	}
	keys := o.Keys
	if keys == nil {
		keys = authn.NewMultiKeychain()
	}
	platform := o.Platform
	if platform == nil {
		platform = &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(keys), remote.WithPlatform(*platform)}

	f, err := os.CreateTemp(o.TempDir, "telo-layer-*.tar")
	if err != nil {
		return v1.Hash{}, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(f.Name()) }()
	if err := WriteLayerTar(f, o.Root, o.Dirs, o.Follow); err != nil {
		return v1.Hash{}, err
	}
	layer, err := tarball.LayerFromFile(f.Name())
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layer: %w", err)
	}
	img, err := remote.Image(base, ropts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("pull %s: %w", o.Base, err)
	}
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("append layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cfg = cfg.DeepCopy()
	cfg.Config.Env = append(slices.DeleteFunc(cfg.Config.Env, func(e string) bool { return strings.HasPrefix(e, "TELO_CACHE_DIR=") }),
		"TELO_CACHE_DIR=/telo-cache")
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(dest, img, ropts[:2]...); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", o.Dest, err)
	}
	return img.Digest()
}

// WriteLayerTar writes dirs (image paths, read under root) as one tar
// stream, each with its parent directories.
func WriteLayerTar(w io.Writer, root string, dirs, follow []string) error {
	tw := tar.NewWriter(w)
	seenDir := map[string]bool{}
	for _, d := range dirs {
		d = path.Clean("/" + d)
		// Parents first.
		parts := strings.Split(strings.TrimPrefix(d, "/"), "/")
		for i := 1; i < len(parts); i++ {
			p := strings.Join(parts[:i], "/") + "/"
			if !seenDir[p] {
				seenDir[p] = true
				if err := tw.WriteHeader(dirHeader(p)); err != nil {
					return err
				}
			}
		}
		if err := addTree(tw, filepath.Join(root, d), strings.TrimPrefix(d, "/"), slices.Contains(follow, d), 0); err != nil {
			return err
		}
	}
	return tw.Close()
}

var epoch = time.Unix(0, 0).UTC()

func dirHeader(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}
}

func addTree(tw *tar.Writer, host, name string, follow bool, depth int) error {
	if depth > 64 {
		return fmt.Errorf("%s: too deep (a symbolic link loop?)", host)
	}
	st, err := os.Lstat(host)
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		if !follow {
			target, err := os.Readlink(host)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX})
		}
		if st, err = os.Stat(host); err != nil {
			return err
		}
	}
	switch {
	case st.IsDir():
		if err := tw.WriteHeader(dirHeader(name + "/")); err != nil {
			return err
		}
		ents, err := os.ReadDir(host)
		if err != nil {
			return err
		}
		for _, e := range ents { // sorted by name
			// A ConfigMap volume's ..data and ..<timestamp> entries.
			if follow && strings.HasPrefix(e.Name(), "..") {
				continue
			}
			if err := addTree(tw, filepath.Join(host, e.Name()), name+"/"+e.Name(), follow, depth+1); err != nil {
				return err
			}
		}
		return nil
	case st.Mode().IsRegular():
		mode := int64(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		f, err := os.Open(host)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: st.Size(), Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		n, err := io.Copy(tw, f)
		if err == nil && n != st.Size() {
			err = errors.New("file changed while read")
		}
		if err != nil {
			return fmt.Errorf("%s: %w", host, err)
		}
		return nil
	default:
		return nil // sockets, devices, fifos: not image content
	}
}

// DockerConfigKeychain reads $DOCKER_CONFIG/config.json (the mounted push
// secret); no such file is an anonymous keychain.
func DockerConfigKeychain(dir string) (authn.Keychain, error) {
	if dir == "" {
		return authn.NewMultiKeychain(), nil
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return authn.NewMultiKeychain(), nil
	}
	if err != nil {
		return nil, err
	}
	return ParseDockerConfig(data)
}
