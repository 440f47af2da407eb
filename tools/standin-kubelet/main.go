// Command standin-kubelet is a test-only kubelet: it registers a Node with a
// real API server and runs the pods bound to it as local processes, one
// program per container chosen by --image-map, each pod on its own loopback
// IP (also given to every container as POD_IP). It is shipped nowhere.
//
// Volumes are bind-mounted at their mountPath in a private mount namespace
// per container (root needed); where that is impossible, --volumes=env
// leaves the filesystem alone and passes TELO_VOLUME_<NAME>=<dir> instead.
// As root, each container runs as the user and groups of its security
// contexts (runAsUser, runAsGroup, fsGroup, supplementalGroups, with
// runAsNonRoot checked) and the mapped programs are staged under --root
// where any user can run them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/imagemap"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/kubelet"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/mountns"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podip"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/sandbox"
)

func main() {
	mountns.Main() // never returns when started as the mount helper
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "standin-kubelet:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	kubeconfig, nodeName, listen, podIPBase, imageMap, root, logLevel, volumes string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("standin-kubelet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of an admin user (required)")
	fs.StringVar(&o.nodeName, "node-name", "standin", "name of the Node to register")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:10250", "HTTPS address for attach (self-signed certificate)")
	fs.StringVar(&o.podIPBase, "pod-ip-base", "127.1", "pods get IPs 127.A.x.y from this 127.A")
	fs.StringVar(&o.imageMap, "image-map", "", "image=program,…: full image, then repository without tag, then *")
	fs.StringVar(&o.root, "root", "", "directory for per-pod directories (required)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.volumes, "volumes", "auto", "mount (bind mounts in a mount namespace), env (TELO_VOLUME_*), or auto")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.kubeconfig == "":
		return o, errors.New("--kubeconfig is required")
	case o.root == "":
		return o, errors.New("--root is required")
	case o.volumes != "auto" && o.volumes != string(sandbox.VolumesMount) && o.volumes != string(sandbox.VolumesEnv):
		return o, fmt.Errorf("--volumes %q: want mount, env or auto", o.volumes)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log)

	base, err := podip.ParseBase(o.podIPBase)
	if err != nil {
		return fmt.Errorf("--pod-ip-base: %w", err)
	}
	images, err := imagemap.Parse(o.imageMap)
	if err != nil {
		return fmt.Errorf("--image-map: %w", err)
	}
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("--root: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	// Status writes come in bursts; the client-go default of 5 QPS would
	// delay them by seconds.
	rc.QPS, rc.Burst = 200, 400
	rc.UserAgent = "standin-kubelet"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	volumes := sandbox.VolumeMode(o.volumes)
	if o.volumes == "auto" {
		volumes = ""
	}
	k, err := kubelet.New(kubelet.Config{
		Client: client, NodeName: o.nodeName, Listen: o.listen, PodIPBase: base,
		Images: images, Root: root, Volumes: volumes, Log: log,
	})
	if err != nil {
		return err
	}
	return k.Run(ctx)
}
