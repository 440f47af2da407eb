package imagebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

const app = `kind: Telo.Application
metadata: {name: hello}
imports:
  http: pkg:npm/@telorun/http-server@1.2.0
  kv:
    source: pkg:npm/@telorun/kv@0.3.0
---
kind: Http.Server
metadata: {name: web}
port: 8080
`

const lib = `kind: Telo.Library
imports: [pkg:npm/@telorun/assert@2.0.0, {source: ./lib/other.yaml}]
`

const def = `kind: Telo.Definition
metadata: {name: Greeter}
controllers:
  - pkg:npm/@acme/greeter@1.0.0
  - pkg:cargo/acme-greeter@1.0.0
  - {note: objects are not locators}
`

const defLocal = `kind: Telo.Definition
metadata: {name: Local}
controllers:
  - pkg:npm/@acme/local@1.0.0
  - {local_path: ./controllers/local}
`

// want computes the tag the contract's byte layout gives, independently of
// Tag's code.
func want(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])[:32]
}

func TestTag(t *testing.T) {
	const base = "telorun/node:1.4.0"
	for _, tc := range []struct {
		name string
		in   TagInput
		want string
	}{
		{
			name: "imports and controllers",
			in: TagInput{BaseImage: base, TeloRegistryURL: "https://registry.telo.run", Files: []File{
				{"telo.yaml", []byte(app)}, {"lib/lib.yaml", []byte(lib)}, {"defs/def.yml", []byte(def)},
				{"README.md", []byte("# not yaml: {[")},
			}},
			want: want("base", base, "telo-registry", "https://registry.telo.run",
				"import", "./lib/other.yaml", "import", "pkg:npm/@telorun/assert@2.0.0",
				"import", "pkg:npm/@telorun/http-server@1.2.0", "import", "pkg:npm/@telorun/kv@0.3.0",
				"controller", "pkg:cargo/acme-greeter@1.0.0", "controller", "pkg:npm/@acme/greeter@1.0.0"),
		},
		{
			name: "base digest when resolved",
			in:   TagInput{BaseImage: base, BaseDigest: "sha256:abc", Files: []File{{"telo.yaml", []byte(app)}}},
			want: want("base", base, "base-digest", "sha256:abc", "telo-registry", "",
				"import", "pkg:npm/@telorun/http-server@1.2.0", "import", "pkg:npm/@telorun/kv@0.3.0"),
		},
		{
			name: "no dependencies",
			in:   TagInput{BaseImage: base, Files: []File{{"telo.yaml", []byte("kind: Telo.Application\nmetadata: {name: x}\n")}}},
			want: want("base", base, "telo-registry", ""),
		},
		{
			name: "fallback: a yaml file fails to parse",
			in: TagInput{BaseImage: base, Files: []File{
				{"telo.yaml", []byte(app)}, {"b.yaml", []byte("a: [unclosed\n")},
			}},
			want: want("base", base, "telo-registry", "",
				"import", "pkg:npm/@telorun/http-server@1.2.0", "import", "pkg:npm/@telorun/kv@0.3.0",
				"file", "b.yaml", "a: [unclosed\n", "file", "telo.yaml", app),
		},
		{
			name: "fallback: a definition has a local_path",
			in: TagInput{BaseImage: base, Files: []File{
				{"z.yaml", []byte(defLocal)}, {"a.js", []byte("module.exports = 1\n")},
			}},
			want: want("base", base, "telo-registry", "",
				"controller", "pkg:npm/@acme/local@1.0.0",
				"file", "a.js", "module.exports = 1\n", "file", "z.yaml", defLocal),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Tag(tc.in); got != tc.want {
				t.Fatalf("Tag = %s, want %s", got, tc.want)
			}
			if len(tc.want) != 32 {
				t.Fatalf("tag length %d", len(tc.want))
			}
		})
	}
}

func TestTagIgnoresWhatDoesNotChangeDependencies(t *testing.T) {
	in := TagInput{BaseImage: "b:1", Files: []File{{"telo.yaml", []byte(app)}}}
	changed := TagInput{BaseImage: "b:1", Files: []File{
		{"telo.yaml", []byte(app + "---\nkind: Http.Route\nmetadata: {name: r}\n")},
		{"extra.txt", []byte("anything")},
	}}
	if Tag(in) != Tag(changed) {
		t.Fatal("a change outside the dependency key changed the tag")
	}
	other := TagInput{BaseImage: "b:2", Files: in.Files}
	if Tag(in) == Tag(other) {
		t.Fatal("another base image gave the same tag")
	}
	// The fallback covers every file, so a non-YAML change matters there.
	fb := []File{{"z.yaml", []byte(defLocal)}, {"a.js", []byte("1")}}
	fb2 := []File{{"z.yaml", []byte(defLocal)}, {"a.js", []byte("2")}}
	if Tag(TagInput{BaseImage: "b:1", Files: fb}) == Tag(TagInput{BaseImage: "b:1", Files: fb2}) {
		t.Fatal("full-content fallback ignored a file's contents")
	}
	// Order of files does not matter.
	rev := slices.Clone(fb)
	slices.Reverse(rev)
	if Tag(TagInput{BaseImage: "b:1", Files: fb}) != Tag(TagInput{BaseImage: "b:1", Files: rev}) {
		t.Fatal("file order changed the tag")
	}
}
