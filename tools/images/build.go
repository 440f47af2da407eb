package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// DefaultSource is org.opencontainers.image.source unless -source says
// otherwise.
const DefaultSource = "https://github.com/telorunner/telorunner"

// Binary is one image: the Go package built into it.
type Binary struct {
	Name   string // image and binary name
	Module string // module directory under the repository root
	Pkg    string // package path inside the module
}

// Binaries are the images `make images` writes: every standalone service,
// the all-in-one and the workspace-server of watch pods. devkernel and
// iotail have none: devkernel is a stand-in for the Telo CLI that tests
// and `make run` use (sessions on Kubernetes run Telo's own kernel image),
// iotail a client for a terminal.
var Binaries = []Binary{
	{"api-edge", "services/api-edge", "./cmd/api-edge"},
	{"pod-driver", "services/pod-driver", "./cmd/pod-driver"},
	{"supervisor", "services/supervisor", "./cmd/supervisor"},
	{"workspace-proxy", "services/workspace-proxy", "./cmd/workspace-proxy"},
	{"workspace-server", "services/workspace-proxy", "./cmd/workspace-server"},
	{"telorunner", "services/telorunner", "./cmd/telorunner"},
	// The layer builder of run images (RUNNER_BUILDER=layer): the push
	// container of the Kubernetes build Jobs.
	{"telo-layer", "services/pod-driver", "./cmd/telo-layer"},
}

// The image's user: numeric, not root, the uid the chart and the driver's
// pods run as.
const (
	UID     = 1000
	GID     = 1000
	User    = "1000:1000"
	Home    = "/home/telorunner"
	BinDir  = "/usr/local/bin"
	CAFile  = "/etc/ssl/certs/ca-certificates.crt"
	RefName = "org.opencontainers.image.ref.name"
)

// Options of Build.
type Options struct {
	Root     string    // repository root
	Out      string    // OCI layouts; default <Root>/dist/oci
	Revision string    // org.opencontainers.image.revision
	Source   string    // org.opencontainers.image.source; default DefaultSource
	Created  time.Time // every file's and the image's time
	Arch     string    // GOARCH
	Only     []string  // build only these binaries (tests); nil = all
}

// Image is one built image.
type Image struct {
	Name   string
	Ref    string // <repository>/<name>:<version>
	Digest v1.Hash
	Dir    string // its OCI layout
}

// ChartDefaults reads the image repository (values.yaml image.repository)
// and the tag (Chart.yaml appVersion) the chart names by default.
func ChartDefaults(root string) (repository, tag string, err error) {
	dir := filepath.Join(root, "deploy/helm/telorunner")
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	for file, into := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "", "", err
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			return "", "", fmt.Errorf("%s: %w", file, err)
		}
	}
	tag = values.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	if values.Image.Repository == "" || tag == "" {
		return "", "", fmt.Errorf("chart %s: image.repository %q, appVersion %q: both required", dir, values.Image.Repository, tag)
	}
	return values.Image.Repository, tag, nil
}

func defaultOut(root string) string { return filepath.Join(root, "dist/oci") }

// Build compiles the binaries and writes one OCI layout per image under
// opts.Out (replacing what was there).
func Build(ctx context.Context, opts Options) ([]Image, error) {
	if opts.Out == "" {
		opts.Out = defaultOut(opts.Root)
	}
	if opts.Source == "" {
		opts.Source = DefaultSource
	}
	if opts.Arch == "" {
		return nil, fmt.Errorf("arch: required")
	}
	opts.Created = opts.Created.UTC()
	repo, tag, err := ChartDefaults(opts.Root)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(opts.Out); err != nil {
		return nil, err
	}
	binDir := filepath.Join(opts.Out, ".bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)

	base, err := baseLayer(opts.Created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	var imgs []Image
	var list []string
	for _, b := range Binaries {
		if opts.Only != nil && !slices.Contains(opts.Only, b.Name) {
			continue
		}
		bin := filepath.Join(binDir, b.Name)
		if err := goBuild(ctx, opts, tag, b, bin); err != nil {
			return nil, err
		}
		ref := repo + "/" + b.Name + ":" + tag
		img, err := image(opts, tag, b.Name, base, bin)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", b.Name, err)
		}
		dir := filepath.Join(opts.Out, b.Name)
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			return nil, fmt.Errorf("layout %s: %w", dir, err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefName: ref})); err != nil {
			return nil, fmt.Errorf("write %s: %w", dir, err)
		}
		d, err := img.Digest()
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, Image{Name: b.Name, Ref: ref, Digest: d, Dir: dir})
		list = append(list, ref+"@"+d.String()+"\n")
	}
	slices.Sort(list)
	if err := os.WriteFile(filepath.Join(opts.Out, "images.txt"), []byte(strings.Join(list, "")), 0o644); err != nil {
		return nil, err
	}
	return imgs, nil
}

// goBuild builds b's static binary into out: no cgo, no build paths, no
// VCS stamp or build id that would differ between two checkouts of the
// same commit.
func goBuild(ctx context.Context, opts Options, version string, b Binary, out string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	ldflags := fmt.Sprintf("-s -w -buildid= -X github.com/telorunner/telorunner/pkg/version.Version=%s -X github.com/telorunner/telorunner/pkg/version.Revision=%s", version, opts.Revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", abs, b.Pkg)
	cmd.Dir = filepath.Join(opts.Root, b.Module)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+opts.Arch, "GOWORK=off", "GOFLAGS=")
	if outb, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", b.Name, err, outb)
	}
	return nil
}

// image assembles the image of one binary.
func image(opts Options, version, name string, base v1.Layer, bin string) (v1.Image, error) {
	binLayer, err := binaryLayer(opts.Created, name, bin)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: opts.Created}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: "telorunner images: base (passwd, CA roots, /tmp)"}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: "telorunner images: " + BinDir + "/" + name}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS = "linux"
	cf.Architecture = opts.Arch
	labels := Labels(opts, version, name)
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinDir + "/" + name},
		Env:        []string{"PATH=" + BinDir, "HOME=" + Home, "SSL_CERT_FILE=" + CAFile},
		WorkingDir: Home,
		Labels:     labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	// The manifest carries the same annotations, for registries that
	// show manifest annotations rather than config labels.
	return mutate.Annotations(img, maps.Clone(labels)).(v1.Image), nil
}

// Labels are the OCI labels of image name.
func Labels(opts Options, version, name string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    name,
		"org.opencontainers.image.source":   opts.Source,
		"org.opencontainers.image.revision": opts.Revision,
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.created":  opts.Created.Format(time.RFC3339),
	}
}
