package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: images build|push [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	root := fs.String("root", "../..", "repository root")
	out := fs.String("out", "", "output directory of the OCI layouts (default <root>/dist/oci)")
	switch os.Args[1] {
	case "build":
		revision := fs.String("revision", "", "source revision (org.opencontainers.image.revision)")
		created := fs.Int64("created", 0, "creation time of every file and image, Unix seconds")
		arch := fs.String("arch", runtime.GOARCH, "GOARCH of the images")
		source := fs.String("source", DefaultSource, "org.opencontainers.image.source")
		_ = fs.Parse(os.Args[2:])
		opts := Options{Root: *root, Out: *out, Revision: *revision, Created: time.Unix(*created, 0).UTC(), Arch: *arch, Source: *source}
		imgs, err := Build(ctx, opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "images build:", err)
			os.Exit(1)
		}
		for _, im := range imgs {
			fmt.Printf("%s@%s\n", im.Ref, im.Digest)
		}
	case "push":
		registry := fs.String("registry", "", "registry and path to push to, e.g. registry.example.com/telo")
		insecure := fs.Bool("insecure", false, "plain HTTP")
		_ = fs.Parse(os.Args[2:])
		if *registry == "" {
			fmt.Fprintln(os.Stderr, "images push: -registry (REGISTRY=…) is required")
			os.Exit(2)
		}
		dir := *out
		if dir == "" {
			dir = defaultOut(*root)
		}
		pushed, err := Push(ctx, dir, *registry, *insecure)
		if err != nil {
			fmt.Fprintln(os.Stderr, "images push:", err)
			os.Exit(1)
		}
		for _, p := range pushed {
			fmt.Println(p)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: images build|push [flags]")
		os.Exit(2)
	}
}
