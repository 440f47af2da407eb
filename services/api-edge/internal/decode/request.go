package decode

import (
	"fmt"

	"github.com/telorunner/telorunner/pkg/contract"
)

// CreateRequest is a decoded POST /v1/sessions body.
type CreateRequest struct {
	Bundle  contract.Bundle
	Env     map[string]string
	Config  contract.SessionConfig
	Ports   []contract.PortMapping
	Inspect bool
	Mode    string
	Agent   string
	Apps    []contract.AppSpec // nil when absent
}

// Create decodes a POST /v1/sessions body the reference's lenient way; a
// refusal is a *SchemaError naming the property.
func Create(data []byte) (CreateRequest, error) {
	var r CreateRequest
	body, err := Parse(data, "body")
	if err != nil {
		return r, err
	}
	b, _, err := body.Object("bundle", true)
	if err != nil {
		return r, err
	}
	if r.Bundle, err = parseBundle(b); err != nil {
		return r, err
	}
	if r.Env, err = body.StringMap("env", true); err != nil {
		return r, err
	}
	c, _, err := body.Object("config", true)
	if err != nil {
		return r, err
	}
	if r.Config, err = parseConfig(c); err != nil {
		return r, err
	}
	if r.Ports, err = parsePorts(body, "ports"); err != nil {
		return r, err
	}
	if r.Inspect, _, err = body.Boolean("inspect"); err != nil {
		return r, err
	}
	if r.Mode, _, err = body.Enum("mode", false, contract.ModeRun, contract.ModeWatch); err != nil {
		return r, err
	}
	if r.Mode == "" {
		r.Mode = contract.ModeRun
	}
	if r.Agent, _, err = body.Str("agent", false, 1); err != nil {
		return r, err
	}
	if r.Apps, _, err = body.Apps("apps", false); err != nil {
		return r, err
	}
	return r, nil
}

// Apps reads the SessionAppSpec array at key: at least one item, each
// one an AppSpec; nil (and false) when absent and not required.
func (o Obj) Apps(key string, required bool) ([]contract.AppSpec, bool, error) {
	items, present, err := o.Array(key, required)
	if err != nil || !present {
		return nil, present, err
	}
	if len(items) < 1 {
		return nil, true, Errorf("%s/%s must NOT have fewer than 1 items", o.Path, key)
	}
	specs := make([]contract.AppSpec, 0, len(items))
	for i, it := range items {
		a, err := AsObject(it, fmt.Sprintf("%s/%s/%d", o.Path, key, i))
		if err != nil {
			return nil, true, err
		}
		spec, err := AppSpec(a)
		if err != nil {
			return nil, true, err
		}
		specs = append(specs, spec)
	}
	return specs, true, nil
}

// AppSpec reads one SessionAppSpec (name 1-63 characters, entry, ports,
// io tty by default).
func AppSpec(o Obj) (contract.AppSpec, error) {
	var a contract.AppSpec
	var err error
	if a.Name, _, err = o.Str("name", true, 1); err != nil {
		return a, err
	}
	if len(a.Name) > 63 {
		return a, Errorf("%s/name must NOT have more than 63 characters", o.Path)
	}
	if a.EntryRelativePath, _, err = o.Str("entryRelativePath", true, 1); err != nil {
		return a, err
	}
	if a.Ports, err = parsePorts(o, "ports"); err != nil {
		return a, err
	}
	if a.IO, _, err = o.Enum("io", false, contract.IOTTY, contract.IOStreams); err != nil {
		return a, err
	}
	if a.IO == "" {
		a.IO = contract.IOTTY
	}
	return a, nil
}

func parseBundle(b Obj) (contract.Bundle, error) {
	var out contract.Bundle
	var err error
	if out.EntryRelativePath, _, err = b.Str("entryRelativePath", true, 1); err != nil {
		return out, err
	}
	files, _, err := b.Array("files", true)
	if err != nil {
		return out, err
	}
	out.Files = make([]contract.BundleFile, 0, len(files))
	for i, f := range files {
		o, err := AsObject(f, fmt.Sprintf("%s/files/%d", b.Path, i))
		if err != nil {
			return out, err
		}
		var bf contract.BundleFile
		if bf.RelativePath, _, err = o.Str("relativePath", true, 1); err != nil {
			return out, err
		}
		if bf.Contents, _, err = o.Str("contents", true, 0); err != nil {
			return out, err
		}
		// The request schema does not list encoding and passes it through
		// (3.5): any value is kept, never refused. Only "base64" decodes;
		// every other value is text where the files are written.
		bf.Encoding = o.Passthrough("encoding")
		out.Files = append(out.Files, bf)
	}
	return out, nil
}

func parseConfig(c Obj) (contract.SessionConfig, error) {
	var out contract.SessionConfig
	var err error
	if out.Image, _, err = c.Str("image", true, 1); err != nil {
		return out, err
	}
	if out.PullPolicy, _, err = c.Enum("pullPolicy", true, "missing", "always", "never"); err != nil {
		return out, err
	}
	if out.RegistryURL, _, err = c.Str("registryUrl", false, 0); err != nil {
		return out, err
	}
	return out, nil
}

func parsePorts(o Obj, key string) ([]contract.PortMapping, error) {
	items, ok, err := o.Array(key, false)
	if err != nil || !ok {
		return []contract.PortMapping{}, err
	}
	out := make([]contract.PortMapping, 0, len(items))
	for i, it := range items {
		p, err := AsObject(it, fmt.Sprintf("%s/%s/%d", o.Path, key, i))
		if err != nil {
			return nil, err
		}
		port, _, err := p.Integer("port", true, 1, 65535)
		if err != nil {
			return nil, err
		}
		proto, _, err := p.Enum("protocol", true, "tcp", "udp")
		if err != nil {
			return nil, err
		}
		out = append(out, contract.PortMapping{Port: port, Protocol: proto})
	}
	return out, nil
}

// AppRequest is a decoded POST /v1/apps/:name/sessions body.
type AppRequest struct {
	Env     map[string]string
	Ports   []contract.PortMapping
	Inspect bool
}

// App decodes a POST /v1/apps/:name/sessions body (empty: no env, no
// ports).
func App(data []byte) (AppRequest, error) {
	r := AppRequest{Env: map[string]string{}, Ports: []contract.PortMapping{}}
	if len(trimSpace(data)) == 0 {
		return r, nil
	}
	body, err := Parse(data, "body")
	if err != nil {
		return r, err
	}
	if r.Env, err = body.StringMap("env", false); err != nil {
		return r, err
	}
	if r.Ports, err = parsePorts(body, "ports"); err != nil {
		return r, err
	}
	if r.Inspect, _, err = body.Boolean("inspect"); err != nil {
		return r, err
	}
	return r, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\r' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}
