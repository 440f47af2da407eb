package local

import (
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

func TestBundleFiles(t *testing.T) {
	kernel := script(t, "exec sleep 600\n")
	b := newBackend(t, func(o *Options) { o.KernelCommand = []string{kernel} })
	spec := runSpec("first", contract.IOStreams)
	spec.Bundle.Files = append(spec.Bundle.Files,
		contract.BundleFile{RelativePath: "./telo.yaml", Contents: "second"},
		contract.BundleFile{RelativePath: "/abs/x.txt", Contents: "abs"},
		contract.BundleFile{RelativePath: "/../up.txt", Contents: "clamped"},
		contract.BundleFile{RelativePath: "deep/a/../b/c.txt", Contents: "deep"},
		contract.BundleFile{RelativePath: "bin/data.bin", Contents: base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xff}), Encoding: "base64"},
		// An encoding outside the enum passed the edge (contract 3.5): text.
		contract.BundleFile{RelativePath: "other.txt", Contents: "AAEC", Encoding: "hex"},
	)
	rec := newRecorder()
	w := start(t, b, spec, rec)
	appDir := filepath.Join(b.root, spec.SessionID, "app")
	want := map[string]string{
		"telo.yaml":    "second",
		"abs/x.txt":    "abs",
		"up.txt":       "clamped",
		"deep/b/c.txt": "deep",
		"bin/data.bin": "\x00\x01\x02\xff",
		"other.txt":    "AAEC",
	}
	got := map[string]string{}
	err := filepath.WalkDir(appDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(appDir, p)
		got[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("bundle files = %q, want %q", got, want)
	}
	if got := dirEntries(t, filepath.Join(b.root, spec.SessionID)); !slices.Equal(got, []string{"app", "driver", "home", "pid"}) {
		t.Errorf("session directory = %v, want [app home pid]", got)
	}
	stop(t, w)
}

func TestBundleTraversalRejected(t *testing.T) {
	bad := []contract.BundleFile{
		{RelativePath: "../escape.txt", Contents: "x"},
		{RelativePath: "a/../../escape.txt", Contents: "x"},
		{RelativePath: "../../../../../../tmp/escape.txt", Contents: "x"},
		{RelativePath: "..", Contents: "x"},
		{RelativePath: "dir/", Contents: "x"},
		{RelativePath: "nul\x00.txt", Contents: "x"},
		{RelativePath: "", Contents: "x"},
		{RelativePath: "bad.bin", Contents: "!!!", Encoding: "base64"},
	}
	for _, f := range bad {
		t.Run(strconv.Quote(f.RelativePath), func(t *testing.T) {
			parent := t.TempDir()
			kernel := script(t, "exec sleep 600\n")
			b := newBackend(t, func(o *Options) {
				o.KernelCommand = []string{kernel}
				o.WorkRoot = filepath.Join(parent, "work")
			})
			spec := runSpec("ok", contract.IOStreams)
			spec.Bundle.Files = append(spec.Bundle.Files, f)
			w, err := b.Start(context.Background(), spec, newRecorder())
			var se *backend.StartError
			if !errors.As(err, &se) || se.Stage != "create" {
				t.Fatalf("Start() = %v, %v; want a create StartError", w, err)
			}
			if got := dirEntries(t, parent); !slices.Equal(got, []string{"work"}) {
				t.Errorf("next to the work root: %v, want only [work]", got)
			}
			if got := dirEntries(t, b.root); len(got) != 0 {
				t.Errorf("work root after a failed start = %v, want empty", got)
			}
		})
	}
}

func TestSelfContained(t *testing.T) {
	t.Run("image cannot run", func(t *testing.T) {
		b := newBackend(t, nil)
		for _, image := range []string{"telorun/app:1", "", "relative/bin arg", "/no/such/binary"} {
			spec := runSpec("", contract.IOTTY)
			spec.SelfContained = true
			spec.Config.Image = image
			_, err := b.Start(context.Background(), spec, newRecorder())
			want := "pull: image " + image + " cannot run on the local backend (give an absolute path to an executable)"
			var se *backend.StartError
			if !errors.As(err, &se) || err.Error() != want {
				t.Errorf("Start(image %q) = %v, want %q", image, err, want)
			}
		}
		if got := dirEntries(t, b.root); len(got) != 0 {
			t.Errorf("work root = %v, want empty", got)
		}
	})
	t.Run("absolute executable", func(t *testing.T) {
		b := newBackend(t, nil)
		bin := script(t, "printf 'ARGS:'; for a in \"$@\"; do printf ' [%s]' \"$a\"; done; echo\nexit 7\n")
		spec := runSpec("", contract.IOStreams)
		spec.SelfContained = true
		spec.Inspect = true
		spec.Config.Image = bin + "  one two"
		rec := newRecorder()
		w := start(t, b, spec, rec)
		exit := waitDone(t, w)
		if exit.Code == nil || *exit.Code != 7 {
			t.Errorf("Exit() = %+v, want code 7", exit)
		}
		if out := rec.output(app, contract.TagStdout); !strings.Contains(out, "ARGS: [one] [two]\n") {
			t.Errorf("output = %q, want the image's own args and no inspect flags", out)
		}
	})
}

func TestStartExecFailure(t *testing.T) {
	kernel := script(t, "exit 0\n")
	b := newBackend(t, func(o *Options) { o.KernelCommand = []string{kernel} })
	if err := os.Chmod(kernel, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := b.Start(context.Background(), runSpec("x", contract.IOTTY), newRecorder())
	var se *backend.StartError
	if !errors.As(err, &se) || se.Stage != "start" {
		t.Fatalf("Start() = %v, want a start StartError", err)
	}
	if got := dirEntries(t, b.root); len(got) != 0 {
		t.Errorf("work root after a failed start = %v, want empty", got)
	}
}

func TestStartRejects(t *testing.T) {
	b := newBackend(t, nil)
	watch := runSpec("x", contract.IOTTY)
	watch.Mode = contract.ModeWatch
	badID := runSpec("x", contract.IOTTY)
	badID.SessionID = "../etc"
	two := runSpec("x", contract.IOTTY)
	two.Apps = append(two.Apps, backend.App{Name: "b", Entry: "telo.yaml"})
	for name, spec := range map[string]backend.Spec{"watch": watch, "bad id": badID, "two apps": two} {
		_, err := b.Start(context.Background(), spec, newRecorder())
		var se *backend.StartError
		if !errors.As(err, &se) || se.Stage != "create" {
			t.Errorf("Start(%s) = %v, want a create StartError", name, err)
		}
	}
}
