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

// envOf is a LookupEnv over a fixed set of variables.
func envOf(kv ...string) LookupEnv {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

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
		// Telo's form: a name-keyed map, resolved env first, then default;
		// the order written is kept.
		{"ports", "kind: Telo.Application\nmetadata: {name: app}\nports:\n  web: {env: PORT_WEB, default: 3000}\n  dns: {env: PORT_DNS, protocol: udp}\n  api: {env: PORT_API, default: 8080, protocol: tcp, extra: ignored}\n  admin: {env: PORT_ADMIN, default: 9000}\n",
			Manifest{Name: "app", Ports: []Port{
				{Name: "web", Env: "PORT_WEB", Default: 3000, Port: 3000, Protocol: "tcp"},
				{Name: "dns", Env: "PORT_DNS", Port: 53, Protocol: "udp"},
				{Name: "api", Env: "PORT_API", Default: 8080, Port: 8081, Protocol: "tcp"},
				{Name: "admin", Env: "PORT_ADMIN", Default: 9000, Port: 9000, Protocol: "tcp"},
			}}},
		{"ports block style", "kind: Telo.Application\nmetadata:\n  name: hello\n  version: 1.0.0\nports:\n  http:\n    env: PORT_HELLO\n    default: 39123\n",
			Manifest{Name: "hello", Ports: []Port{{Name: "http", Env: "PORT_HELLO", Default: 39123, Port: 39123, Protocol: "tcp"}}}},
		{"x-devkernel", "kind: Telo.Application\nmetadata: {name: app}\nx-devkernel:\n  exitAfterMs: 0\n  exitCode: 3\n  failAt: start\n  failCode: CEL_UNKNOWN_FIELD\n  outputBytes: 100\n  startDelayMs: 20\n",
			Manifest{Name: "app", Ports: []Port{}, Dev: DevOptions{ExitAfter: ms(0), ExitCode: 3, FailAtStart: true,
				FailCode: "CEL_UNKNOWN_FIELD", OutputBytes: 100, StartDelay: 20 * time.Millisecond}}},
		{"failAt without code", "kind: Telo.Application\nmetadata: {name: app}\nx-devkernel: {failAt: start}\n",
			Manifest{Name: "app", Ports: []Port{}, Dev: DevOptions{FailAtStart: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseManifest([]byte(tt.yaml), envOf("PORT_DNS", "53", "PORT_API", "8081", "PORT_ADMIN", ""))
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
		{"ports a list", app + "ports: [{name: http, port: 3000}]\n", "ports must be a mapping"},
		{"ports scalar", app + "ports: 3000\n", "ports must be a mapping"},
		{"port entry scalar", app + "ports: {http: 3000}\n", "ports.http must be a mapping"},
		{"port name empty", app + "ports: {\"\": {env: PORT_A, default: 1}}\n", "must be a non-empty name"},
		{"env missing", app + "ports: {http: {default: 3000}}\n", "ports.http.env"},
		{"env not string", app + "ports: {http: {env: 5, default: 3000}}\n", "ports.http.env"},
		{"unset no default", app + "ports: {http: {env: PORT_UNSET}}\n", "PORT_UNSET is not set"},
		{"empty no default", app + "ports: {http: {env: PORT_EMPTY}}\n", "PORT_EMPTY is not set"},
		{"env not integer", app + "ports: {http: {env: PORT_WORD, default: 3000}}\n", `PORT_WORD="web"`},
		{"env float", app + "ports: {http: {env: PORT_FLOAT}}\n", "PORT_FLOAT"},
		{"env zero", app + "ports: {http: {env: PORT_ZERO}}\n", "PORT_ZERO"},
		{"env too big", app + "ports: {http: {env: PORT_BIG}}\n", "PORT_BIG"},
		{"default string", app + "ports: {http: {env: PORT_UNSET, default: \"3000\"}}\n", "ports.http.default"},
		{"default zero", app + "ports: {http: {env: PORT_UNSET, default: 0}}\n", "ports.http.default"},
		{"default too big", app + "ports: {http: {env: PORT_OK, default: 70000}}\n", "ports.http.default"},
		{"bad protocol", app + "ports: {http: {env: PORT_OK, protocol: sctp}}\n", "protocol"},
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
			env := envOf("PORT_EMPTY", "", "PORT_WORD", "web", "PORT_FLOAT", "30.5", "PORT_ZERO", "0", "PORT_BIG", "70000", "PORT_OK", "3000")
			got, err := ParseManifest([]byte(tt.yaml), env)
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
	_, err := LoadManifest(missing, envOf())
	var le *LoadError
	if !errors.As(err, &le) || le.Code() != CodeManifestInvalid || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadManifest(missing, envOf()) = %v, want a LoadError wrapping ErrNotExist", err)
	}
	if _, err := LoadManifest("https://example.com/telo.yaml", envOf()); !errors.As(err, &le) {
		t.Errorf("LoadManifest(url) = %v, want a LoadError", err)
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add("kind: Telo.Application\nmetadata: {name: app}\nports: {http: {env: PORT_HTTP, default: 3000}}\nx-devkernel: {exitAfterMs: 5}\n")
	f.Add("---\nkind: Telo.Application\n---\n")
	f.Add("kind: Telo.Application\nmetadata: {name: &a x}\nports: *a\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseManifest([]byte(s), envOf("PORT_HTTP", "8080"))
		if err == nil && (m.Name == "" || m.Ports == nil) {
			t.Errorf("ParseManifest(%q) = %+v without error, want a name and a port list", s, m)
		}
		if err == nil {
			for _, p := range m.Ports {
				if p.Port < 1 || p.Port > 65535 || p.Name == "" || p.Env == "" {
					t.Errorf("ParseManifest(%q) port %+v, want a resolved port in 1..65535 with name and env", s, p)
				}
			}
		}
	})
}
