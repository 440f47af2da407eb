package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push sends every image of the layouts under dir to
// <registry>/<name>:<tag> (name and tag from the image's reference) and
// returns the pushed references with their digests.
func Push(ctx context.Context, dir, registry string, insecure bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	var pushed []string
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		idx, err := layout.ImageIndexFromPath(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, desc := range im.Manifests {
			src, err := name.NewTag(desc.Annotations[RefName])
			if err != nil {
				return nil, fmt.Errorf("%s: reference %q: %w", e.Name(), desc.Annotations[RefName], err)
			}
			repo := src.RepositoryStr()
			dst, err := name.NewTag(strings.TrimSuffix(registry, "/")+"/"+repo[strings.LastIndex(repo, "/")+1:]+":"+src.TagStr(), opts...)
			if err != nil {
				return nil, fmt.Errorf("target for %s: %w", src, err)
			}
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, err
			}
			if err := remote.Write(dst, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return nil, fmt.Errorf("push %s: %w", dst, err)
			}
			pushed = append(pushed, dst.String()+"@"+desc.Digest.String())
		}
	}
	if len(pushed) == 0 {
		return nil, fmt.Errorf("%s: no images (run make images)", dir)
	}
	return pushed, nil
}
