package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
)

// FuzzParseCreate feeds arbitrary bodies to the POST /v1/sessions decoder.
// It must never panic, must fail only with a schema error, and when it
// accepts, the paths it returns are the client's strings unchanged (they
// are normalized later, by a step that must see the raw input to name it).
func FuzzParseCreate(f *testing.F) {
	for _, seed := range []string{
		mustJSON(f, validCreate()),
		mustJSON(f, validCreate(set("mode", "watch"), set("agent", "helper"), set("apps", []any{app("web", 3000), app("api")}))),
		mustJSON(f, validCreate(set("ports", body{"port": "8080", "protocol": "tcp"}), set("inspect", "true"))),
		mustJSON(f, validCreate(set("bundle/files", body{"relativePath": 12, "contents": true}), set("env", body{"N": 1.5}))),
		mustJSON(f, validCreate(set("bundle/entryRelativePath", "../x"), set("apps", body{"name": "a", "entryRelativePath": "/"}))),
		`{"bundle":{"entryRelativePath":"a","files":[]},"env":{},"config":{"image":"i","pullPolicy":"never","registryUrl":null}}`,
		`{"bundle":{"entryRelativePath":"a","files":[]},"env":{},"config":{"image":"i","pullPolicy":"never"}} {}`,
		`{"bundle":{"entryRelativePath":"\u0000","files":[{"relativePath":"\ud800","contents":""}]},"env":{},"config":{"image":"i","pullPolicy":"always"},"ports":[{"port":1e400,"protocol":"tcp"}]}`,
		`[]`, `null`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseCreate(data)
		if err != nil {
			var se *schemaError
			if !errors.As(err, &se) {
				t.Fatalf("parseCreate() error = %T %v, want a *schemaError", err, err)
			}
			return
		}
		if req.Mode != contract.ModeRun && req.Mode != contract.ModeWatch {
			t.Fatalf("parseCreate() mode = %q, want run or watch", req.Mode)
		}
		if req.Env == nil || req.Ports == nil || req.Bundle.Files == nil {
			t.Fatalf("parseCreate() = %+v, want non-nil env, ports and files", req)
		}
		if req.Config.Image == "" {
			t.Fatalf("parseCreate() accepted an empty image")
		}
		switch req.Config.PullPolicy {
		case "missing", "always", "never":
		default:
			t.Fatalf("parseCreate() pullPolicy = %q", req.Config.PullPolicy)
		}
		for _, p := range req.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.Protocol != "tcp" && p.Protocol != "udp") {
				t.Fatalf("parseCreate() port = %+v, want 1-65535 tcp|udp", p)
			}
		}

		// Decode independently and compare the paths.
		var v any
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatalf("parseCreate() accepted %q, which does not decode: %v", data, err)
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

func TestClampDim(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want int
		ok   bool
	}{
		{"integer", float64(80), 80, true},
		{"one", float64(1), 1, true},
		{"floored", 3.9, 3, true},
		{"max", float64(10000), 10000, true},
		{"clamped", float64(10001), 10000, true},
		{"huge", 1e300, 10000, true},
		{"numeric string", "120", 120, true},
		{"numeric string with space", " 24 ", 24, true},
		{"fractional string", "24.9", 24, true},
		{"exponent string", "1e3", 1000, true},
		{"true is 1", true, 1, true},
		{"zero", float64(0), 0, false},
		{"half", 0.5, 0, false},
		{"0.999", 0.999, 0, false},
		{"negative", float64(-5), 0, false},
		{"negative zero", math.Copysign(0, -1), 0, false},
		{"NaN", math.NaN(), 0, false},
		{"+Inf", math.Inf(1), 0, false},
		{"-Inf", math.Inf(-1), 0, false},
		{"NaN string", "NaN", 0, false},
		{"Infinity string", "Infinity", 0, false},
		{"word", "wide", 0, false},
		{"empty string", "", 0, false},
		{"false", false, 0, false},
		{"null", nil, 0, false},
		{"object", map[string]any{}, 0, false},
		{"array", []any{float64(80)}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := clampDim(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("clampDim(%#v) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzClampDim decodes a resize field the way the io reader does and checks
// 7.7's bounds and, for numbers, the exact value.
func FuzzClampDim(f *testing.F) {
	for _, s := range []string{`80`, `3.9`, `10001`, `0.5`, `-1`, `"24"`, `"NaN"`, `1e400`, `true`, `null`, `"x"`, `[]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var v any
		if json.Unmarshal([]byte(raw), &v) != nil {
			return
		}
		got, ok := clampDim(v)
		if ok && (got < 1 || got > 10000) {
			t.Fatalf("clampDim(%s) = %d, want 1-10000", raw, got)
		}
		if !ok && got != 0 {
			t.Fatalf("clampDim(%s) = %d, false, want 0 when ignored", raw, got)
		}
		if n, isNum := v.(float64); isNum {
			want, wantOK := 0, false
			if fl := math.Floor(n); fl >= 1 {
				want, wantOK = int(math.Min(fl, 10000)), true
			}
			if got != want || ok != wantOK {
				t.Fatalf("clampDim(%s) = %d, %v, want %d, %v", raw, got, ok, want, wantOK)
			}
		}
	})
}

func TestParsePosition(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"12", 12, true},
		{"12abc", 12, true},
		{"007", 7, true},
		{"3.7", 3, true},
		{"18446744073709551615", math.MaxUint64, true},
		{"", 0, false},
		{"x", 0, false},
		{"abc12", 0, false},
		{"-1", 0, false},
		{"18446744073709551616", 0, false}, // overflows: does not parse
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := parsePosition(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("parsePosition(%q) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
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
			_, err := parseObject([]byte(tc.in), "body")
			if (err == nil) != tc.ok {
				t.Errorf("parseObject(%q) error = %v, want ok %v", tc.in, err, tc.ok)
			}
		})
	}
}
