package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "telo")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PATH": dir + ":/usr/bin:/bin", "X": "x"}
	tests := []struct {
		name     string
		command  []string
		args     []string
		wantPath string
		wantArgv []string
	}{
		{"entrypoint", nil, []string{"a", "$(X)"}, prog, []string{prog, "a", "x"}},
		{"program by its file name", []string{"telo", "run"}, nil, prog, []string{"telo", "run"}},
		{"host shell", []string{"sh", "-c"}, []string{"exec telo $(X)"}, "/usr/bin/sh", []string{"sh", "-c", "exec telo x"}},
		{"unknown name runs the image's program", []string{"kernel-cli", "serve"}, nil, prog, []string{"kernel-cli", "serve"}},
		{"missing absolute path", []string{"/opt/app/bin/server"}, nil, prog, []string{"/opt/app/bin/server"}},
		{"existing absolute path", []string{"/bin/sh"}, nil, "/bin/sh", []string{"/bin/sh"}},
		{"expanded command", []string{"$(X)"}, nil, prog, []string{"x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &v1.Container{Command: tt.command, Args: tt.args}
			path, argv := command(c, prog, env)
			want := tt.wantPath
			if want == "/usr/bin/sh" {
				// /bin may be a link to /usr/bin, or not.
				if p, ok := lookPath("sh", "/usr/bin:/bin"); ok {
					want = p
				}
			}
			if path != want || !slices.Equal(argv, tt.wantArgv) {
				t.Errorf("command() = %q, %q, want %q, %q", path, argv, want, tt.wantArgv)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{"work": "WORK", "telo-cache": "TELO_CACHE", "a.b9": "A_B9"} {
		if got := envName(in); got != want {
			t.Errorf("envName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestResourceRef(t *testing.T) {
	c := &v1.Container{}
	c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: mustQuantity("512Mi")}
	tests := []struct {
		ref  v1.ResourceFieldSelector
		want string
	}{
		{v1.ResourceFieldSelector{Resource: "limits.memory"}, "536870912"},
		{v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: mustQuantity("1Mi")}, "512"},
		{v1.ResourceFieldSelector{Resource: "limits.cpu"}, "8"},
		{v1.ResourceFieldSelector{Resource: "limits.cpu", Divisor: mustQuantity("1m")}, "8000"},
		{v1.ResourceFieldSelector{Resource: "requests.cpu"}, "0"},
	}
	for _, tt := range tests {
		got, err := resourceRef(c, &tt.ref)
		if err != nil || got != tt.want {
			t.Errorf("resourceRef(%s / %s) = %q, %v, want %q", tt.ref.Resource, tt.ref.Divisor.String(), got, err, tt.want)
		}
	}
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
