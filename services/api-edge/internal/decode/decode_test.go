package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
)

// FuzzDecodeCreate feeds arbitrary bodies to the POST /v1/sessions decoder.
// It must never panic, must fail only with a schema error, and when it
// accepts, the paths it returns are the client's strings unchanged (they
// are normalized later, by a step that must see the raw input to name it).
func FuzzDecodeCreate(f *testing.F) {
	valid := `{"bundle":{"entryRelativePath":"telo.yaml","files":[{"relativePath":"telo.yaml","contents":"kind: Telo.Application\n"},{"relativePath":"lib/mod.yaml","contents":"kind: Telo.Library\n"}]},"env":{},"config":{"image":"telorun/node:latest-slim","pullPolicy":"missing"}`
	for _, seed := range []string{
		valid + `}`,
		valid + `,"mode":"watch","agent":"helper","apps":[{"name":"web","entryRelativePath":"telo.yaml","ports":[{"port":3000,"protocol":"tcp"}]},{"name":"api","entryRelativePath":"telo.yaml","ports":[]}]}`,
		valid + `,"ports":{"port":"8080","protocol":"tcp"},"inspect":"true"}`,
		`{"bundle":{"entryRelativePath":"telo.yaml","files":{"relativePath":12,"contents":true}},"env":{"N":1.5},"config":{"image":"i","pullPolicy":"missing"}}`,
		`{"bundle":{"entryRelativePath":"../x","files":[]},"env":{},"config":{"image":"i","pullPolicy":"missing"},"apps":{"name":"a","entryRelativePath":"/"}}`,
		`{"bundle":{"entryRelativePath":"a","files":[]},"env":{},"config":{"image":"i","pullPolicy":"never","registryUrl":null}}`,
		`{"bundle":{"entryRelativePath":"a","files":[]},"env":{},"config":{"image":"i","pullPolicy":"never"}} {}`,
		`{"bundle":{"entryRelativePath":"\u0000","files":[{"relativePath":"\ud800","contents":""}]},"env":{},"config":{"image":"i","pullPolicy":"always"},"ports":[{"port":1e400,"protocol":"tcp"}]}`,
		`[]`, `null`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := Create(data)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("Create() error = %T %v, want a *SchemaError", err, err)
			}
			return
		}
		if req.Mode != contract.ModeRun && req.Mode != contract.ModeWatch {
			t.Fatalf("Create() mode = %q, want run or watch", req.Mode)
		}
		if req.Env == nil || req.Ports == nil || req.Bundle.Files == nil {
			t.Fatalf("Create() = %+v, want non-nil env, ports and files", req)
		}
		if req.Config.Image == "" {
			t.Fatalf("Create() accepted an empty image")
		}
		switch req.Config.PullPolicy {
		case "missing", "always", "never":
		default:
			t.Fatalf("Create() pullPolicy = %q", req.Config.PullPolicy)
		}
		for _, p := range req.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.Protocol != "tcp" && p.Protocol != "udp") {
				t.Fatalf("Create() port = %+v, want 1-65535 tcp|udp", p)
			}
		}

		// Decode independently and compare the paths.
		var v any
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatalf("Create() accepted %q, which does not decode: %v", data, err)
		}
		top := v.(map[string]any)
		bundle := top["bundle"].(map[string]any)
		if got, want := req.Bundle.EntryRelativePath, scalar(t, bundle["entryRelativePath"]); got != want {
			t.Fatalf("entry = %q, want the input %q", got, want)
		}
		files := items(bundle["files"])
		if len(req.Bundle.Files) != len(files) {
			t.Fatalf("files = %d, want %d", len(req.Bundle.Files), len(files))
		}
		for i, f := range files {
			if got, want := req.Bundle.Files[i].RelativePath, scalar(t, f.(map[string]any)["relativePath"]); got != want {
				t.Fatalf("file %d path = %q, want the input %q", i, got, want)
			}
		}
		if a, ok := top["apps"]; ok && a != nil {
			apps := items(a)
			if len(req.Apps) != len(apps) || len(apps) == 0 {
				t.Fatalf("apps = %d, want %d (at least one)", len(req.Apps), len(apps))
			}
			for i, a := range apps {
				if got, want := req.Apps[i].EntryRelativePath, scalar(t, a.(map[string]any)["entryRelativePath"]); got != want {
					t.Fatalf("app %d entry = %q, want the input %q", i, got, want)
				}
				if n := req.Apps[i].Name; n == "" || len(n) > 63 {
					t.Fatalf("app %d name = %q, want 1-63 characters", i, n)
				}
			}
		} else if req.Apps != nil {
			t.Fatalf("apps = %+v, want nil when absent", req.Apps)
		}
	})
}

// scalar is the string a lenient string field holds.
func scalar(t *testing.T, v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		if x {
			return "true"
		}
		return "false"
	}
	t.Fatalf("accepted a non-scalar string field %T %v", v, v)
	return ""
}

// items is a lenient array: a lone value is one item.
func items(v any) []any {
	if a, ok := v.([]any); ok {
		return a
	}
	return []any{v}
}

// TestParseObjectTrailingData pins the decoder's JSON strictness: exactly
// one JSON value, optionally surrounded by whitespace.
func TestParseObjectTrailingData(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{`{}`, true},
		{" \n{}\n\t ", true},
		{`{} {}`, false},
		{`{}x`, false},
		{`{}]`, false},
		{`{}}`, false},
		{`{"a":1}` + strings.Repeat(" ", 10) + `null`, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), "body")
			if (err == nil) != tc.ok {
				t.Errorf("Parse(%q) error = %v, want ok %v", tc.in, err, tc.ok)
			}
		})
	}
}
