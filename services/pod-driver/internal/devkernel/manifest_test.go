package devkernel

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseManifest(t *testing.T) {
	ms := func(n int) *time.Duration { d := time.Duration(n) * time.Millisecond; return &d }
	tests := []struct {
		name string
		yaml string
		want Manifest
	}{
		{"minimal", "kind: Telo.Application\nmetadata:\n  name: app\n",
			Manifest{Name: "app", Ports: []Port{}}},
		{"later document", "kind: Telo.Library\nmetadata: {name: lib}\n---\nkind: Telo.Application\nmetadata: {name: app}\n",
			Manifest{Name: "app", Ports: []Port{}}},
		{"first application wins", "kind: Telo.Application\nmetadata: {name: one}\n---\nkind: Telo.Application\nmetadata: {name: two}\n",
			Manifest{Name: "one", Ports: []Port{}}},
		{"ports", "kind: Telo.Application\nmetadata: {name: app}\nports:\n  - {name: http, port: 3000}\n  - {port: 53, protocol: udp}\n  - {port: 8080, protocol: tcp, extra: ignored}\n",
			Manifest{Name: "app", Ports: []Port{{"http", 3000, "tcp"}, {"", 53, "udp"}, {"", 8080, "tcp"}}}},
		{"x-devkernel", "kind: Telo.Application\nmetadata: {name: app}\nx-devkernel:\n  exitAfterMs: 0\n  exitCode: 3\n  failAt: start\n  failCode: CEL_UNKNOWN_FIELD\n  outputBytes: 100\n  startDelayMs: 20\n",
			Manifest{Name: "app", Ports: []Port{}, Dev: DevOptions{ExitAfter: ms(0), ExitCode: 3, FailAtStart: true,
				FailCode: "CEL_UNKNOWN_FIELD", OutputBytes: 100, StartDelay: 20 * time.Millisecond}}},
		{"failAt without code", "kind: Telo.Application\nmetadata: {name: app}\nx-devkernel: {failAt: start}\n",
			Manifest{Name: "app", Ports: []Port{}, Dev: DevOptions{FailAtStart: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseManifest([]byte(tt.yaml))
			if err != nil {
				t.Fatalf("ParseManifest() error = %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("ParseManifest() = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

func TestParseManifestErrors(t *testing.T) {
	const app = "kind: Telo.Application\nmetadata: {name: app}\n"
	tests := []struct{ name, yaml, want string }{
		{"empty", "", "no document"},
		{"not yaml", "kind: [\n", "parse yaml"},
		{"scalar", "hello\n", "no document"},
		{"no application", "kind: Telo.Library\nmetadata: {name: x}\n", "no document"},
		{"no name", "kind: Telo.Application\n", "metadata.name"},
		{"empty name", "kind: Telo.Application\nmetadata: {name: \"\"}\n", "metadata.name"},
		{"numeric name", "kind: Telo.Application\nmetadata: {name: 5}\n", "metadata.name"},
		{"ports not a list", app + "ports: {port: 1}\n", "ports must be a list"},
		{"port entry scalar", app + "ports: [3000]\n", "ports[0] must be a mapping"},
		{"port missing", app + "ports: [{name: http}]\n", "ports[0].port"},
		{"port string", app + "ports: [{port: \"3000\"}]\n", "ports[0].port"},
		{"port float", app + "ports: [{port: 30.5}]\n", "ports[0].port"},
		{"port zero", app + "ports: [{port: 0}]\n", "ports[0].port"},
		{"port too big", app + "ports: [{port: 70000}]\n", "ports[0].port"},
		{"port name not string", app + "ports: [{port: 1, name: 2}]\n", "ports[0].name"},
		{"bad protocol", app + "ports: [{port: 1, protocol: sctp}]\n", "protocol"},
		{"dev not a mapping", app + "x-devkernel: [1]\n", "x-devkernel must be a mapping"},
		{"dev unknown key", app + "x-devkernel: {exitAfter: 1}\n", "unknown key"},
		{"dev negative", app + "x-devkernel: {exitAfterMs: -1}\n", "exitAfterMs"},
		{"dev exit code range", app + "x-devkernel: {exitCode: 256}\n", "exitCode"},
		{"dev failAt other", app + "x-devkernel: {failAt: load}\n", "failAt"},
		{"dev failCode alone", app + "x-devkernel: {failCode: X}\n", "failCode"},
		{"dev failCode number", app + "x-devkernel: {failAt: start, failCode: 3}\n", "failCode"},
		{"dev outputBytes string", app + "x-devkernel: {outputBytes: lots}\n", "outputBytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseManifest([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseManifest() = %+v, %v, want error containing %q", got, err, tt.want)
			}
		})
	}
}

func TestLoadManifest(t *testing.T) {
	dir := t.TempDir()
	if got, want := EntryFile(dir), filepath.Join(dir, "telo.yaml"); got != want {
		t.Errorf("EntryFile(dir) = %q, want %q", got, want)
	}
	missing := filepath.Join(dir, "telo.yaml")
	_, err := LoadManifest(missing)
	var le *LoadError
	if !errors.As(err, &le) || le.Code() != CodeManifestInvalid || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadManifest(missing) = %v, want a LoadError wrapping ErrNotExist", err)
	}
	if _, err := LoadManifest("https://example.com/telo.yaml"); !errors.As(err, &le) {
		t.Errorf("LoadManifest(url) = %v, want a LoadError", err)
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add("kind: Telo.Application\nmetadata: {name: app}\nports: [{port: 3000}]\nx-devkernel: {exitAfterMs: 5}\n")
	f.Add("---\nkind: Telo.Application\n---\n")
	f.Add("kind: Telo.Application\nmetadata: {name: &a x}\nports: *a\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseManifest([]byte(s))
		if err == nil && (m.Name == "" || m.Ports == nil) {
			t.Errorf("ParseManifest(%q) = %+v without error, want a name and a port list", s, m)
		}
	})
}
