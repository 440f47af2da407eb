package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCatalog(t *testing.T) {
	raw := `{
	  "zeta": {"image": "img/zeta", "port": 8080, "title": "Zeta", "description": "Z app",
	           "pullPolicy": "always", "env": {"OPENAI_API_KEY": "sk-1", "PORT": "8080"}},
	  "__proto__": {"image": "img/proto"},
	  "alpha": {"image": "img/alpha", "port": 8.08e3, "unknown": [1, 2]},
	  "constructor": {"image": "img/ctor", "pullPolicy": "never", "port": 1},
	  "Ünïcode name": {"image": "img/u", "env": {}, "port": 65535.0, "title": "", "description": ""}
	}`
	got, err := parseCatalog(raw)
	if err != nil {
		t.Fatalf("parseCatalog() error = %v", err)
	}
	want := Catalog{apps: []App{
		{Name: "zeta", Image: "img/zeta", Env: map[string]string{"OPENAI_API_KEY": "sk-1", "PORT": "8080"},
			PullPolicy: "always", Port: 8080, Title: "Zeta", Description: "Z app"},
		{Name: "__proto__", Image: "img/proto", Env: map[string]string{}, PullPolicy: "missing"},
		{Name: "alpha", Image: "img/alpha", Env: map[string]string{}, PullPolicy: "missing", Port: 8080},
		{Name: "constructor", Image: "img/ctor", Env: map[string]string{}, PullPolicy: "never", Port: 1},
		{Name: "Ünïcode name", Image: "img/u", Env: map[string]string{}, PullPolicy: "missing", Port: 65535},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseCatalog() = %+v, want %+v", got, want)
	}
	if got, want := got.Names(), []string{"zeta", "__proto__", "alpha", "constructor", "Ünïcode name"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
	if got, want := got.AgentNames(), []string{"zeta", "alpha", "constructor", "Ünïcode name"}; !reflect.DeepEqual(got, want) {
		t.Errorf("AgentNames() = %q, want %q", got, want)
	}
	if got, want := got.Len(), 5; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
}

func TestCatalogLookup(t *testing.T) {
	c, err := parseCatalog(`{"__proto__": {"image": "img/p"}, "agent": {"image": "img/a", "env": {"K": "v"}}}`)
	if err != nil {
		t.Fatalf("parseCatalog() error = %v", err)
	}
	tests := []struct {
		name      string
		lookup    string
		wantImage string
		wantOK    bool
	}{
		{"proto is an ordinary key", "__proto__", "img/p", true},
		{"present", "agent", "img/a", true},
		{"absent", "constructor", "", false},
		{"case sensitive", "Agent", "", false},
		{"empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := c.Lookup(tt.lookup)
			if ok != tt.wantOK || got.Image != tt.wantImage {
				t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tt.lookup, got.Image, ok, tt.wantImage, tt.wantOK)
			}
		})
	}

	a, _ := c.Lookup("agent")
	a.Env["K"] = "changed"
	if again, _ := c.Lookup("agent"); again.Env["K"] != "v" {
		t.Errorf("Lookup() env after caller mutation = %q, want %q", again.Env["K"], "v")
	}
}

func TestEmptyCatalog(t *testing.T) {
	var c Catalog
	if _, ok := c.Lookup("x"); ok {
		t.Error("Lookup() on zero Catalog = found, want not found")
	}
	if got := c.Names(); len(got) != 0 {
		t.Errorf("Names() = %q, want none", got)
	}
	if got := c.AgentNames(); len(got) != 0 {
		t.Errorf("AgentNames() = %q, want none", got)
	}
	parsed, err := parseCatalog(`{}`)
	if err != nil || parsed.Len() != 0 {
		t.Errorf("parseCatalog({}) = %d entries, %v; want 0, nil", parsed.Len(), err)
	}
}

func TestParseCatalogRejects(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		wantMsg string
	}{
		// Invalid JSON.
		{"truncated", `{"a": {"image": "x"}`, "invalid JSON"},
		{"trailing comma", `{"a": {"image": "x"},}`, "invalid JSON"},
		{"single quotes", `{'a': {'image': 'x'}}`, "invalid JSON"},
		{"bare word", `apps`, "invalid JSON"},
		{"trailing data", `{"a": {"image": "x"}} {}`, "invalid JSON"},
		{"trailing garbage", `{"a": {"image": "x"}}x`, "invalid JSON"},
		{"bad entry syntax", `{"a": {"image": x}}`, "invalid JSON"},

		// Top level not an object.
		{"top array", `[{"image": "x"}]`, "must be a JSON object"},
		{"top string", `"x"`, "must be a JSON object"},
		{"top number", `1`, "must be a JSON object"},
		{"top null", `null`, "must be a JSON object"},
		{"top bool", `true`, "must be a JSON object"},

		// Names.
		{"empty name", `{"": {"image": "x"}}`, "app name must not be empty"},
		{"duplicate name", `{"a": {"image": "x"}, "a": {"image": "y"}}`, `app "a": duplicate name`},

		// Entry not an object.
		{"entry string", `{"a": "img"}`, `app "a": entry must be a JSON object`},
		{"entry array", `{"a": []}`, `app "a": entry must be a JSON object`},
		{"entry null", `{"a": null}`, `app "a": entry must be a JSON object`},
		{"entry number", `{"a": 3}`, `app "a": entry must be a JSON object`},

		// Image.
		{"image missing", `{"a": {}}`, `app "a": image must be a non-empty string`},
		{"image empty", `{"a": {"image": ""}}`, "image must be a non-empty string"},
		{"image null", `{"a": {"image": null}}`, "image must be a non-empty string"},
		{"image number", `{"a": {"image": 1}}`, "image must be a non-empty string"},
		{"image object", `{"a": {"image": {}}}`, "image must be a non-empty string"},
		{"image key case", `{"a": {"Image": "x"}}`, "image must be a non-empty string"},

		// Env.
		{"env array", `{"a": {"image": "x", "env": []}}`, "env must be an object of strings"},
		{"env string", `{"a": {"image": "x", "env": "K=v"}}`, "env must be an object of strings"},
		{"env null", `{"a": {"image": "x", "env": null}}`, "env must be an object of strings"},
		{"env number value", `{"a": {"image": "x", "env": {"PORT": 8080}}}`, `env "PORT" must be a string`},
		{"env null value", `{"a": {"image": "x", "env": {"K": null}}}`, `env "K" must be a string`},
		{"env bool value", `{"a": {"image": "x", "env": {"K": true}}}`, `env "K" must be a string`},
		{"env object value", `{"a": {"image": "x", "env": {"K": {}}}}`, `env "K" must be a string`},
		{"env empty name", `{"a": {"image": "x", "env": {"": "v"}}}`, "env names must not be empty"},

		// Pull policy.
		{"pull policy unknown", `{"a": {"image": "x", "pullPolicy": "IfNotPresent"}}`, "pullPolicy must be missing, always or never"},
		{"pull policy case", `{"a": {"image": "x", "pullPolicy": "Always"}}`, "pullPolicy must be"},
		{"pull policy empty", `{"a": {"image": "x", "pullPolicy": ""}}`, "pullPolicy must be"},
		{"pull policy null", `{"a": {"image": "x", "pullPolicy": null}}`, "pullPolicy must be"},
		{"pull policy number", `{"a": {"image": "x", "pullPolicy": 1}}`, "pullPolicy must be"},

		// Port.
		{"port string", `{"a": {"image": "x", "port": "8080"}}`, "port must be an integer in 1-65535"},
		{"port fraction", `{"a": {"image": "x", "port": 8080.5}}`, "port must be an integer in 1-65535"},
		{"port zero", `{"a": {"image": "x", "port": 0}}`, "port must be an integer"},
		{"port negative", `{"a": {"image": "x", "port": -1}}`, "port must be an integer"},
		{"port too large", `{"a": {"image": "x", "port": 65536}}`, "port must be an integer"},
		{"port huge", `{"a": {"image": "x", "port": 1e400}}`, "port must be an integer"},
		{"port null", `{"a": {"image": "x", "port": null}}`, "port must be an integer"},
		{"port bool", `{"a": {"image": "x", "port": true}}`, "port must be an integer"},
		{"port array", `{"a": {"image": "x", "port": [8080]}}`, "port must be an integer"},

		// Title and description.
		{"title number", `{"a": {"image": "x", "title": 1}}`, "title must be a string"},
		{"title null", `{"a": {"image": "x", "title": null}}`, "title must be a string"},
		{"description array", `{"a": {"image": "x", "description": ["d"]}}`, "description must be a string"},
		{"description bool", `{"a": {"image": "x", "description": false}}`, "description must be a string"},

		// A bad entry after good ones still fails the whole catalog.
		{"later entry bad", `{"a": {"image": "x"}, "b": {"image": "y", "port": "1"}}`, `app "b": port must be`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCatalog(tt.raw)
			if err == nil {
				t.Fatalf("parseCatalog(%s) = %+v, want error", tt.raw, got)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("parseCatalog(%s) error = %q, want it to contain %q", tt.raw, err, tt.wantMsg)
			}
		})
	}
}

func TestParseCatalogErrorHidesSecrets(t *testing.T) {
	_, err := parseCatalog(`{"a": {"image": "registry.example/secret-image", "env": {"TOKEN": "sk-secret", "N": 1}}}`)
	if err == nil {
		t.Fatal("parseCatalog() error = nil, want error")
	}
	for _, secret := range []string{"sk-secret", "secret-image"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("parseCatalog() error = %q, leaks %q", err, secret)
		}
	}
}
