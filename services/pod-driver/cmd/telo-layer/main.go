// Command telo-layer is the layer builder of run images (contract 11.11,
// RUNNER_BUILDER=layer): the push container of a build Job runs it after
// the base image's telo install. It appends /app and /telo-cache as one
// layer onto the base image and pushes the result, authenticating with
// $DOCKER_CONFIG/config.json (the mounted push secret). No daemon, no
// privilege: it only reads files and talks to registries.
//
//	telo-layer --base <image> --dest <image> [--app /app] [--cache /telo-cache] [--insecure]
//
// `telo-layer version` prints the build's version.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/telorunner/telorunner/pkg/version"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
)

func main() {
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, "telo-layer")
		return
	}
	base := flag.String("base", "", "base image")
	dest := flag.String("dest", "", "image to push")
	app := flag.String("app", "/app", "the bundle (symbolic links followed: a ConfigMap volume)")
	cache := flag.String("cache", "/telo-cache", "the installed dependency cache (symbolic links kept)")
	insecure := flag.Bool("insecure", false, "allow plain-HTTP registries")
	flag.Parse()
	if *base == "" || *dest == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: telo-layer --base <image> --dest <image> [--app /app] [--cache /telo-cache] [--insecure]")
		os.Exit(2)
	}
	keys, err := imagebuild.DockerConfigKeychain(os.Getenv("DOCKER_CONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "telo-layer: push credentials:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("telo-layer: %s + [%s %s] -> %s\n", *base, *app, *cache, *dest)
	digest, err := imagebuild.Layer(ctx, imagebuild.LayerOptions{
		Base: *base, Dest: *dest, Dirs: []string{*app, *cache}, Follow: []string{*app},
		Insecure: *insecure, Keys: keys,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "telo-layer:", err)
		os.Exit(1)
	}
	fmt.Printf("telo-layer: pushed %s@%s\n", *dest, digest)
}
