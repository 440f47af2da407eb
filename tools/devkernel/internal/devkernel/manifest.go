package devkernel

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"
)

// CodeManifestInvalid is the failure code of every load failure.
const CodeManifestInvalid = "ERR_MANIFEST_VALIDATION_FAILED"

// Manifest is what devkernel understands of a Telo.Application document.
type Manifest struct {
	Name  string
	Ports []Port
	Dev   DevOptions
}

// Port is one entry of the application's `ports:` block, a name-keyed map
// as Telo writes it:
//
//	ports:
//	  http: {env: PORT_HTTP, default: 3000, protocol: tcp}
//
// Port is the value resolved at load: the variable named by Env when it is
// set and non-empty, else Default.
type Port struct {
	Name     string
	Env      string
	Default  int // 0: none
	Port     int
	Protocol string // "tcp" or "udp"
}

// LookupEnv reads one environment variable; os.LookupEnv is the kernel's.
type LookupEnv func(key string) (string, bool)

// DevOptions is the manifest's `x-devkernel:` block: knobs for tests.
type DevOptions struct {
	// ExitAfter ends the generation this long after Kernel.Started; nil
	// means the generation runs until a signal or a watched change.
	ExitAfter *time.Duration
	// ExitCode is the exit code of a generation ended by ExitAfter.
	ExitCode int
	// FailAtStart makes the generation fail after Kernel.PortsResolved with
	// FailCode (omitted from the payload when empty).
	FailAtStart bool
	FailCode    string
	// OutputBytes is how many pattern bytes to write to stdout after the
	// banner.
	OutputBytes int64
	// StartDelay is slept before Kernel.Initialized.
	StartDelay time.Duration
}

// LoadError is a manifest that cannot be used. Its Code is always
// CodeManifestInvalid.
type LoadError struct {
	Path string
	Err  error
}

func (e *LoadError) Error() string { return fmt.Sprintf("load %s: %v", e.Path, e.Err) }
func (e *LoadError) Unwrap() error { return e.Err }

// Code is the contract failure code.
func (e *LoadError) Code() string { return CodeManifestInvalid }

// EntryFile resolves the command-line path: a directory means its telo.yaml.
// A path that does not exist (yet) is taken as the file itself.
func EntryFile(path string) string {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return filepath.Join(path, "telo.yaml")
	}
	return path
}

// LoadManifest reads and validates the entry file and resolves its ports
// from env. Every failure is a *LoadError.
func LoadManifest(file string, env LookupEnv) (*Manifest, error) {
	if strings.HasPrefix(file, "http://") || strings.HasPrefix(file, "https://") {
		return nil, &LoadError{Path: file, Err: errors.New("remote manifests are not supported")}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, &LoadError{Path: file, Err: err}
	}
	m, err := ParseManifest(data, env)
	if err != nil {
		return nil, &LoadError{Path: file, Err: err}
	}
	return m, nil
}

// ParseManifest picks the first `kind: Telo.Application` document of a YAML
// stream, validates the parts devkernel reads and resolves the ports from
// env. (The YAML library stops at an empty document, so documents after one
// are not seen.)
func ParseManifest(data []byte, env LookupEnv) (*Manifest, error) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, fmt.Errorf("parse yaml: %w", err)
	}
	for _, doc := range f.Docs {
		if doc.Body == nil {
			continue
		}
		var v any
		if err := yaml.NodeToValue(doc.Body, &v); err != nil {
			return nil, fmt.Errorf("parse yaml: %w", err)
		}
		app, ok := v.(map[string]any)
		if !ok || app["kind"] != "Telo.Application" {
			continue
		}
		// The ports again, in the order written (a Go map has none):
		// Kernel.PortsResolved lists them as declared.
		var ordered struct {
			Ports any `yaml:"ports"`
		}
		if err := yaml.NodeToValue(doc.Body, &ordered, yaml.UseOrderedMap()); err != nil {
			return nil, fmt.Errorf("parse yaml: %w", err)
		}
		return parseApp(app, ordered.Ports, env)
	}
	return nil, fmt.Errorf("no document with kind: Telo.Application")
}

func parseApp(app map[string]any, ports any, env LookupEnv) (*Manifest, error) {
	var m Manifest
	meta, _ := app["metadata"].(map[string]any)
	m.Name, _ = meta["name"].(string)
	if m.Name == "" {
		return nil, fmt.Errorf("metadata.name must be a non-empty string")
	}
	var err error
	if m.Ports, err = parsePorts(ports, env); err != nil {
		return nil, err
	}
	if m.Dev, err = parseDev(app["x-devkernel"]); err != nil {
		return nil, err
	}
	return &m, nil
}

func parsePorts(v any, env LookupEnv) ([]Port, error) {
	if v == nil {
		return []Port{}, nil
	}
	block, ok := v.(yaml.MapSlice)
	if !ok {
		return nil, fmt.Errorf("ports must be a mapping of port names to {env, protocol, default}")
	}
	ports := make([]Port, 0, len(block))
	for _, item := range block {
		name, ok := item.Key.(string)
		if !ok || name == "" {
			return nil, fmt.Errorf("ports: key %v must be a non-empty name", item.Key)
		}
		p, err := parsePort(name, item.Value, env)
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// parsePort validates one entry and resolves its port: the env variable
// first (set and non-empty), then default; neither is a load failure, and
// so is a value that is not an integer in 1..65535.
func parsePort(name string, v any, env LookupEnv) (Port, error) {
	e, ok := v.(yaml.MapSlice)
	if !ok {
		return Port{}, fmt.Errorf("ports.%s must be a mapping", name)
	}
	fields := make(map[string]any, len(e))
	for _, kv := range e {
		if k, ok := kv.Key.(string); ok {
			fields[k] = kv.Value
		}
	}
	p := Port{Name: name, Protocol: "tcp"}
	if p.Env, _ = fields["env"].(string); p.Env == "" {
		return Port{}, fmt.Errorf("ports.%s.env must be a non-empty string (the variable that supplies the port)", name)
	}
	if proto, present := fields["protocol"]; present {
		s, _ := proto.(string)
		if s != "tcp" && s != "udp" {
			return Port{}, fmt.Errorf(`ports.%s.protocol must be "tcp" or "udp"`, name)
		}
		p.Protocol = s
	}
	if raw, present := fields["default"]; present {
		n, ok := asInt(raw)
		if !ok || n < 1 || n > 65535 {
			return Port{}, fmt.Errorf("ports.%s.default must be an integer in 1..65535", name)
		}
		p.Default = int(n)
	}
	s, set := env(p.Env)
	switch {
	case set && s != "":
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			return Port{}, fmt.Errorf("ports.%s: %s=%q is not an integer in 1..65535", name, p.Env, s)
		}
		p.Port = n
	case p.Default != 0:
		p.Port = p.Default
	default:
		return Port{}, fmt.Errorf("ports.%s: %s is not set and the port has no default", name, p.Env)
	}
	return p, nil
}

var devKeys = []string{"exitAfterMs", "exitCode", "failAt", "failCode", "outputBytes", "startDelayMs"}

func parseDev(v any) (DevOptions, error) {
	var d DevOptions
	if v == nil {
		return d, nil
	}
	block, ok := v.(map[string]any)
	if !ok {
		return d, fmt.Errorf("x-devkernel must be a mapping")
	}
	for k := range block {
		if !slices.Contains(devKeys, k) {
			return d, fmt.Errorf("x-devkernel: unknown key %q", k)
		}
	}
	nonNeg := func(key string, limit int64) (int64, bool, error) {
		raw, present := block[key]
		if !present {
			return 0, false, nil
		}
		n, ok := asInt(raw)
		if !ok || n < 0 || n > limit {
			return 0, false, fmt.Errorf("x-devkernel.%s must be an integer in 0..%d", key, limit)
		}
		return n, true, nil
	}
	const maxMs = int64(24 * time.Hour / time.Millisecond)
	if n, present, err := nonNeg("exitAfterMs", maxMs); err != nil {
		return d, err
	} else if present {
		after := time.Duration(n) * time.Millisecond
		d.ExitAfter = &after
	}
	n, _, err := nonNeg("exitCode", 255)
	if err != nil {
		return d, err
	}
	d.ExitCode = int(n)
	if d.OutputBytes, _, err = nonNeg("outputBytes", 1<<34); err != nil {
		return d, err
	}
	if n, _, err = nonNeg("startDelayMs", maxMs); err != nil {
		return d, err
	}
	d.StartDelay = time.Duration(n) * time.Millisecond
	if raw, present := block["failAt"]; present {
		if raw != "start" {
			return d, fmt.Errorf(`x-devkernel.failAt must be "start"`)
		}
		d.FailAtStart = true
	}
	if raw, present := block["failCode"]; present {
		s, ok := raw.(string)
		if !ok || !d.FailAtStart {
			return d, fmt.Errorf("x-devkernel.failCode must be a string next to failAt")
		}
		d.FailCode = s
	}
	return d, nil
}

// asInt accepts the integer types the YAML decoder produces.
func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}
