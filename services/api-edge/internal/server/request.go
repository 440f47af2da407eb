package server

import (
	"fmt"

	"github.com/telorunner/telorunner/pkg/contract"
)

// createRequest is a decoded POST /v1/sessions body.
type createRequest struct {
	Bundle  contract.Bundle
	Env     map[string]string
	Config  contract.SessionConfig
	Ports   []contract.PortMapping
	Inspect bool
	Mode    string
	Agent   string
	Apps    []contract.AppSpec // nil when absent
}

func parseCreate(data []byte) (createRequest, error) {
	var r createRequest
	body, err := parseObject(data, "body")
	if err != nil {
		return r, err
	}
	b, _, err := body.object("bundle", true)
	if err != nil {
		return r, err
	}
	if r.Bundle, err = parseBundle(b); err != nil {
		return r, err
	}
	if r.Env, err = body.stringMap("env", true); err != nil {
		return r, err
	}
	c, _, err := body.object("config", true)
	if err != nil {
		return r, err
	}
	if r.Config, err = parseConfig(c); err != nil {
		return r, err
	}
	if r.Ports, err = parsePorts(body, "ports"); err != nil {
		return r, err
	}
	if r.Inspect, _, err = body.boolean("inspect"); err != nil {
		return r, err
	}
	if r.Mode, _, err = body.enum("mode", false, contract.ModeRun, contract.ModeWatch); err != nil {
		return r, err
	}
	if r.Mode == "" {
		r.Mode = contract.ModeRun
	}
	if r.Agent, _, err = body.str("agent", false, 1); err != nil {
		return r, err
	}
	if body.has("apps") {
		items, _, err := body.array("apps", false)
		if err != nil {
			return r, err
		}
		if len(items) < 1 {
			return r, schemaErrf("body/apps must NOT have fewer than 1 items")
		}
		r.Apps = make([]contract.AppSpec, 0, len(items))
		for i, it := range items {
			o, err := asObject(it, fmt.Sprintf("body/apps/%d", i))
			if err != nil {
				return r, err
			}
			a, err := parseAppSpec(o)
			if err != nil {
				return r, err
			}
			r.Apps = append(r.Apps, a)
		}
	}
	return r, nil
}

func parseAppSpec(o obj) (contract.AppSpec, error) {
	var a contract.AppSpec
	var err error
	if a.Name, _, err = o.str("name", true, 1); err != nil {
		return a, err
	}
	if len(a.Name) > 63 {
		return a, schemaErrf("%s/name must NOT have more than 63 characters", o.path)
	}
	if a.EntryRelativePath, _, err = o.str("entryRelativePath", true, 1); err != nil {
		return a, err
	}
	if a.Ports, err = parsePorts(o, "ports"); err != nil {
		return a, err
	}
	if a.IO, _, err = o.enum("io", false, contract.IOTTY, contract.IOStreams); err != nil {
		return a, err
	}
	if a.IO == "" {
		a.IO = contract.IOTTY
	}
	return a, nil
}

func parseBundle(b obj) (contract.Bundle, error) {
	var out contract.Bundle
	var err error
	if out.EntryRelativePath, _, err = b.str("entryRelativePath", true, 1); err != nil {
		return out, err
	}
	files, _, err := b.array("files", true)
	if err != nil {
		return out, err
	}
	out.Files = make([]contract.BundleFile, 0, len(files))
	for i, f := range files {
		o, err := asObject(f, fmt.Sprintf("%s/files/%d", b.path, i))
		if err != nil {
			return out, err
		}
		var bf contract.BundleFile
		if bf.RelativePath, _, err = o.str("relativePath", true, 1); err != nil {
			return out, err
		}
		if bf.Contents, _, err = o.str("contents", true, 0); err != nil {
			return out, err
		}
		// The request schema does not list encoding and passes it through
		// (3.5): any value is kept, never refused. Only "base64" decodes;
		// every other value is text where the files are written.
		bf.Encoding = o.passthrough("encoding")
		out.Files = append(out.Files, bf)
	}
	return out, nil
}

func parseConfig(c obj) (contract.SessionConfig, error) {
	var out contract.SessionConfig
	var err error
	if out.Image, _, err = c.str("image", true, 1); err != nil {
		return out, err
	}
	if out.PullPolicy, _, err = c.enum("pullPolicy", true, "missing", "always", "never"); err != nil {
		return out, err
	}
	if out.RegistryURL, _, err = c.str("registryUrl", false, 0); err != nil {
		return out, err
	}
	return out, nil
}

func parsePorts(o obj, key string) ([]contract.PortMapping, error) {
	items, ok, err := o.array(key, false)
	if err != nil || !ok {
		return []contract.PortMapping{}, err
	}
	out := make([]contract.PortMapping, 0, len(items))
	for i, it := range items {
		p, err := asObject(it, fmt.Sprintf("%s/%s/%d", o.path, key, i))
		if err != nil {
			return nil, err
		}
		port, _, err := p.integer("port", true, 1, 65535)
		if err != nil {
			return nil, err
		}
		proto, _, err := p.enum("protocol", true, "tcp", "udp")
		if err != nil {
			return nil, err
		}
		out = append(out, contract.PortMapping{Port: port, Protocol: proto})
	}
	return out, nil
}

// appRequest is a decoded POST /v1/apps/:name/sessions body.
type appRequest struct {
	Env     map[string]string
	Ports   []contract.PortMapping
	Inspect bool
}

func parseAppRequest(data []byte) (appRequest, error) {
	r := appRequest{Env: map[string]string{}, Ports: []contract.PortMapping{}}
	if len(trimSpace(data)) == 0 {
		return r, nil
	}
	body, err := parseObject(data, "body")
	if err != nil {
		return r, err
	}
	if r.Env, err = body.stringMap("env", false); err != nil {
		return r, err
	}
	if r.Ports, err = parsePorts(body, "ports"); err != nil {
		return r, err
	}
	if r.Inspect, _, err = body.boolean("inspect"); err != nil {
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
