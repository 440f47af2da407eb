package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"strconv"
)

// Pull policies of a catalog entry.
const (
	PullMissing = "missing"
	PullAlways  = "always"
	PullNever   = "never"
)

// App is one operator catalog entry (contract 12.1). Image and Env are
// secret material: never advertise or log them.
type App struct {
	Name        string
	Image       string
	Env         map[string]string // never nil
	PullPolicy  string            // PullMissing, PullAlways or PullNever
	Port        int               // 0 when the entry declares no port
	Title       string
	Description string
}

// Catalog is the operator app catalog of RUNNER_APPS, in the order the names
// appear in the JSON. The zero value is an empty catalog. A Catalog is
// immutable: accessors return copies.
type Catalog struct {
	apps []App
}

// Len returns the number of entries.
func (c Catalog) Len() int { return len(c.apps) }

// Lookup returns the entry called name. Any string is an ordinary key.
func (c Catalog) Lookup(name string) (App, bool) {
	for _, a := range c.apps {
		if a.Name == name {
			a.Env = maps.Clone(a.Env)
			return a, true
		}
	}
	return App{}, false
}

// Names returns every entry name in catalog order.
func (c Catalog) Names() []string {
	names := make([]string, 0, len(c.apps))
	for _, a := range c.apps {
		names = append(names, a.Name)
	}
	return names
}

// Keep returns the catalog of the entries keep accepts, in order, and the
// names of the others.
func (c Catalog) Keep(keep func(App) bool) (Catalog, []string) {
	var out Catalog
	var dropped []string
	for _, a := range c.apps {
		if keep(a) {
			out.apps = append(out.apps, a)
		} else {
			dropped = append(dropped, a.Name)
		}
	}
	return out, dropped
}

// AgentNames returns, in catalog order, the names of entries that declare a
// port and so can run as a co-resident agent. Advertise them only when watch
// sessions are enabled.
func (c Catalog) AgentNames() []string {
	var names []string
	for _, a := range c.apps {
		if a.Port != 0 {
			names = append(names, a.Name)
		}
	}
	return names
}

// parseCatalog parses a non-blank RUNNER_APPS value. Errors name the app and
// field but never echo values, which may be credentials.
func parseCatalog(raw string) (Catalog, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return Catalog{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return Catalog{}, errors.New("must be a JSON object of app name to entry")
	}
	var c Catalog
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Catalog{}, fmt.Errorf("invalid JSON: %w", err)
		}
		name := tok.(string) // object keys are always strings
		var entry json.RawMessage
		if err := dec.Decode(&entry); err != nil {
			return Catalog{}, fmt.Errorf("invalid JSON: %w", err)
		}
		switch {
		case name == "":
			return Catalog{}, errors.New("app name must not be empty")
		case seen[name]:
			return Catalog{}, fmt.Errorf("app %q: duplicate name", name)
		}
		seen[name] = true
		app, err := parseApp(name, entry)
		if err != nil {
			return Catalog{}, fmt.Errorf("app %q: %w", name, err)
		}
		c.apps = append(c.apps, app)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return Catalog{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Catalog{}, errors.New("invalid JSON: data after the top-level object")
	}
	return c, nil
}

func parseApp(name string, raw json.RawMessage) (App, error) {
	var fields map[string]json.RawMessage
	if kind(raw) != '{' || json.Unmarshal(raw, &fields) != nil {
		return App{}, errors.New("entry must be a JSON object")
	}
	app := App{Name: name, Env: map[string]string{}, PullPolicy: PullMissing}

	image, ok := fields["image"]
	if !ok || !jsonString(image, &app.Image) || app.Image == "" {
		return App{}, errors.New("image must be a non-empty string")
	}
	if env, ok := fields["env"]; ok {
		var vals map[string]json.RawMessage
		if kind(env) != '{' || json.Unmarshal(env, &vals) != nil {
			return App{}, errors.New("env must be an object of strings")
		}
		for k, v := range vals {
			if k == "" {
				return App{}, errors.New("env names must not be empty")
			}
			var s string
			if !jsonString(v, &s) {
				return App{}, fmt.Errorf("env %q must be a string", k)
			}
			app.Env[k] = s
		}
	}
	if pp, ok := fields["pullPolicy"]; ok {
		if !jsonString(pp, &app.PullPolicy) ||
			(app.PullPolicy != PullMissing && app.PullPolicy != PullAlways && app.PullPolicy != PullNever) {
			return App{}, errors.New("pullPolicy must be missing, always or never")
		}
	}
	if port, ok := fields["port"]; ok {
		n, ok := jsonPort(port)
		if !ok {
			return App{}, errors.New("port must be an integer in 1-65535")
		}
		app.Port = n
	}
	if t, ok := fields["title"]; ok && !jsonString(t, &app.Title) {
		return App{}, errors.New("title must be a string")
	}
	if d, ok := fields["description"]; ok && !jsonString(d, &app.Description) {
		return App{}, errors.New("description must be a string")
	}
	return app, nil
}

// kind returns the first byte of a JSON value: '{', '[', '"', 'n', 't', 'f',
// or a number's first character.
func kind(raw json.RawMessage) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// jsonString decodes raw into *dst when it is a JSON string (not null).
func jsonString(raw json.RawMessage, dst *string) bool {
	return kind(raw) == '"' && json.Unmarshal(raw, dst) == nil
}

// jsonPort accepts a JSON number whose value is an integer in 1..65535.
// Like the reference's JSON.parse, 8080.0 and 8.08e3 are that integer; a
// string such as "8080" or a fraction such as 8080.5 is not.
func jsonPort(raw json.RawMessage) (int, bool) {
	var n json.Number
	if k := kind(raw); k != '-' && (k < '0' || k > '9') {
		return 0, false
	}
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil || f != math.Trunc(f) || f < 1 || f > 65535 {
		return 0, false
	}
	return int(f), true
}
